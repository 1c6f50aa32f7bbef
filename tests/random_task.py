"""Models that draw random numbers while they train, as a Keras user writes
them (Dropout, GaussianNoise, `keras.random.normal` seeded by the model's
own SeedGenerator in its train_step), each keeping what every replica drew
where a test can read it. Nothing here imports dist_keras: tests train these
with Keras' fit and with dist_keras alike (data: parity_task.dataset_fn).
"""
import keras
import tensorflow as tf

from parity_task import FEATURES

HIDDEN = 16


def _replicas_drew_alike(value):
  """1.0 where every replica of the step drew `value` alike (one device: 1)."""
  drawn = tf.distribute.get_replica_context().all_gather(value[None], 0)
  return tf.cast(tf.reduce_all(tf.equal(drawn, drawn[:1])), tf.float32)


class KeptDropout(keras.layers.Layer):
  """Dropout that keeps its last mask of the first example, each replica
  in its own copy (aggregation "none", as BatchNorm's moving statistics)."""

  def __init__(self, rate, **kwargs):
    super().__init__(**kwargs)
    self.dropout = keras.layers.Dropout(rate)

  def build(self, input_shape):
    self.kept = keras.Variable(tf.zeros((input_shape[-1],)),
                               trainable=False, name="kept")

  def call(self, x, training=None):
    mask = self.dropout(tf.ones_like(x), training=training)
    if training:
      self.kept.assign(mask[0])
    return x * mask


def dropout_noise():
  """Dense -> Dropout (its first mask kept per replica) -> GaussianNoise
  -> Dense, compiled with SGD and MSE."""
  inputs = keras.Input((FEATURES,))
  hidden = keras.layers.Dense(HIDDEN, activation="tanh")(inputs)
  hidden = KeptDropout(0.5, name="kept_dropout")(hidden)
  hidden = keras.layers.GaussianNoise(0.1)(hidden)
  model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


class NoisyStep(keras.Model):
  """A train_step of its own drawing noise from the model's SeedGenerator,
  as a GAN draws its latents: it regresses y on x plus that noise, with
  Dropout, and logs whether every replica drew the same noise and mask
  (`same_noise`, `same_mask`); its test_step draws too (`same_noise`)."""

  def __init__(self):
    super().__init__()
    self.seed_generator = keras.random.SeedGenerator(1337)
    self.hidden = keras.layers.Dense(HIDDEN, activation="tanh")
    self.dropout = keras.layers.Dropout(0.5)
    self.out = keras.layers.Dense(1)
    self.mse = keras.metrics.Mean(name="mse")

  @property
  def metrics(self):
    return [self.mse]

  def call(self, x, training=False):
    return self.out(self.dropout(self.hidden(x), training=training))

  def _noisy(self, x):
    noise = keras.random.normal(tf.shape(x), seed=self.seed_generator)
    return x + 0.1 * noise, _replicas_drew_alike(noise[:1])

  def train_step(self, data):
    x, y = data
    x, same_noise = self._noisy(x)
    mask = self.dropout(tf.ones((1, HIDDEN)), training=True)
    with tf.GradientTape() as tape:
      # A mean over the replica's batch, divided as Keras divides its own.
      replicas = tf.distribute.get_strategy().num_replicas_in_sync
      loss = tf.reduce_mean(tf.square(self(x, training=True) - y)) / replicas
    self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                         self.trainable_variables)
    self.mse.update_state(loss * replicas)
    return {"mse": self.mse.result(), "same_noise": same_noise,
            "same_mask": _replicas_drew_alike(mask)}

  def test_step(self, data):
    x, y = data
    x, same_noise = self._noisy(x)
    self.mse.update_state(tf.reduce_mean(tf.square(self(x) - y)))
    return {"mse": self.mse.result(), "same_noise": same_noise}


def noisy_step():
  model = NoisyStep()
  model(tf.zeros((1, FEATURES)))  # Builds its layers.
  model.compile(optimizer=keras.optimizers.SGD(0.05))
  model.optimizer.build(model.trainable_variables)
  return model
