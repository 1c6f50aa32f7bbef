"""The per-replica math of a train step, shared by the loop and calibration."""
import keras
import tensorflow as tf


def sparse_ce(labels, logits):
  """Per-example cross-entropy from logits."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def num_correct(labels, logits):
  """How many argmax predictions equal the labels (float32)."""
  predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
  return tf.reduce_sum(tf.cast(predicted == labels, tf.float32))


def loss_and_grads(model, inputs, labels, global_batch_size: int):
  """Forward and backward pass on one replica: (loss, logits, grads).

  The loss is divided by the GLOBAL batch: the SUM all-reduce of the grads
  then yields the gradient of the global mean loss, whatever the replica
  count.
  """
  with tf.GradientTape() as tape:
    logits = model(inputs, training=True)
    loss = tf.nn.compute_average_loss(sparse_ce(labels, logits),
                                      global_batch_size=global_batch_size)
    if model.losses:
      loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
  return loss, logits, tape.gradient(loss, model.trainable_variables)
