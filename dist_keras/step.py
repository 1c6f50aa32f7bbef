"""The per-replica math of a train step, shared by the loop and calibration."""
import keras
import tensorflow as tf


def sparse_ce(labels, logits):
  """Per-example cross-entropy from logits."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def per_example_loss(labels, logits):
  """Cross-entropy per example; for per-token labels, its mean over tokens.

  Averaging over the non-batch axes before the division by the global batch
  makes a language model's loss the mean per token (so exp(loss) is its
  perplexity), on the same scale whatever seq_len; classifiers are unchanged.
  """
  loss = sparse_ce(labels, logits)
  if loss.shape.rank > 1:
    loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
  return loss


def num_correct(labels, logits):
  """How many argmax predictions equal the labels (float32).

  Elementwise: for per-token labels it counts correct tokens.
  """
  return tf.reduce_sum(correct_per_example(labels, logits))


def correct_per_example(labels, logits):
  """Correct predictions per example (correct tokens for per-token labels)."""
  predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
  hits = tf.cast(predicted == labels, tf.float32)
  return tf.reshape(hits, [tf.shape(hits)[0], -1]) if hits.shape.rank > 1 \
      else hits[:, None]


def loss_and_grads(model, inputs, labels, global_batch_size: int):
  """Forward and backward pass on one replica: (loss, logits, grads).

  The loss is divided by the GLOBAL batch: the SUM all-reduce of the grads
  then yields the gradient of the global mean loss, whatever the replica
  count.
  """
  with tf.GradientTape() as tape:
    # The loss in float32 whatever the compute dtype (mixed bfloat16).
    logits = tf.cast(model(inputs, training=True), tf.float32)
    loss = tf.nn.compute_average_loss(per_example_loss(labels, logits),
                                      global_batch_size=global_batch_size)
    if model.losses:
      loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
  return loss, logits, tape.gradient(loss, model.trainable_variables)
