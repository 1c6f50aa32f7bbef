"""TensorFlow's stateful random ops (tf.random.normal ...) in what a model
trains with, said at the start in one line (training/random_ops.py).

Silent before: keras.io's WGAN-GP, which calls tf.random.normal in its own
train_step, ended 0.011 off Keras fit after 8 steps on one device, and a
run resumed after step 6 0.011 off the uninterrupted one; the same model
drawing with keras.random.normal and a SeedGenerator was bitwise equal to
both, and is said nothing.
"""
import contextlib
import inspect
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
from dist_keras.errors import UserError
from dist_keras.training import process_state, random_ops, step_optimizers

LATENT, FEATURES, BATCH = 4, 3, 8
CONFIG = {"train.global_batch_size": BATCH, "train.steps": 2,
          "train.log_every": 2, "eval.every": 0, "log.calibration_steps": 0,
          "log.tensorboard": False}


class Wgan(keras.Model):
  """keras.io's WGAN-GP in small: its own train_step and compile, an
  unbuilt optimizer per network, a gradient penalty on an interpolation,
  Dropout in the critic; its latents and interpolation weights drawn with
  tf.random.normal, or (`use_keras`) keras.random.normal from a
  SeedGenerator made in __init__."""

  def __init__(self, use_keras):
    super().__init__()
    self.use_keras = use_keras
    self.generator = keras.Sequential(
        [keras.Input((LATENT,)), keras.layers.Dense(FEATURES)])
    self.critic = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dropout(0.2),
         keras.layers.Dense(1)])
    self.seed_generator = keras.random.SeedGenerator(1337)

  def compile(self, d_optimizer, g_optimizer):  # pylint: disable=arguments-differ
    super().compile()
    self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

  def normal(self, shape):
    if self.use_keras:
      return keras.random.normal(shape, seed=self.seed_generator)
    return tf.random.normal(shape)

  def penalty(self, real, fake):
    alpha = self.normal((tf.shape(real)[0], 1))
    mixed = real + alpha * (fake - real)
    with tf.GradientTape() as tape:
      tape.watch(mixed)
      score = self.critic(mixed, training=True)
    norm = tf.norm(tape.gradient(score, mixed), axis=-1)
    return tf.reduce_mean((norm - 1.0) ** 2)

  def train_step(self, real):
    z = self.normal((tf.shape(real)[0], LATENT))
    with tf.GradientTape() as tape:
      fake = self.generator(z, training=True)
      d_loss = (tf.reduce_mean(self.critic(fake, training=True))
                - tf.reduce_mean(self.critic(real, training=True))
                + 10.0 * self.penalty(real, fake))
    weights = self.critic.trainable_variables
    self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights),
                                         weights))
    with tf.GradientTape() as tape:
      g_loss = -tf.reduce_mean(self.critic(
          self.generator(self.normal((tf.shape(real)[0], LATENT)),
                         training=True), training=True))
    weights = self.generator.trainable_variables
    self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights),
                                         weights))
    return {"d_loss": d_loss, "g_loss": g_loss}


def _wgan(use_keras):
  model = Wgan(use_keras)
  model.compile(keras.optimizers.Adam(2e-4), keras.optimizers.Adam(2e-4))
  return model


def _dataset_fn(split, input_context):
  if split != "train":
    return None  # As keras.io fits it: no validation_data.
  x = np.tanh(np.random.default_rng(0).normal(size=(64, FEATURES)))
  return tf.data.Dataset.from_tensor_slices(x.astype("float32")).repeat(
  ).batch(input_context.get_per_replica_batch_size(BATCH),
          drop_remainder=True)


def _said(use_keras, workdir) -> str:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    dist_keras.fit(lambda: _wgan(use_keras), _dataset_fn,
                   workdir=str(workdir), config=CONFIG,
                   strategy="one_device")
  return out.getvalue()


def test_a_train_step_drawing_with_tf_random_is_said_and_keras_random_not(
    tmp_path):
  """The line names the op, where it is drawn, and the fix; a step drawing
  from a SeedGenerator (and Dropout's) is said nothing."""
  said = _said(False, tmp_path / "tf")
  lines = [line for line in said.splitlines() if "tf.random.normal" in line]
  assert len(lines) == 1, said
  # One place in the code (Wgan.normal's return), drawn 3 times a step.
  line = inspect.getsourcelines(Wgan.normal)
  at = line[1] + next(i for i, text in enumerate(line[0])
                      if "tf.random.normal" in text)
  assert lines[0].endswith(
      "use keras.random.normal(..., seed=self.seed_generator), a "
      "keras.random.SeedGenerator made in __init__: Wgan.train_step draws "
      f"with tf.random.normal (test_random_ops.py:{at} in normal), whose "
      "state no checkpoint keeps: resumes and fit differ"), lines[0]
  said = _said(True, tmp_path / "keras")
  assert "draws with tf.random" not in said, said


class Noisy(keras.layers.Layer):
  """Adds noise drawn with `draw` in its training call, inside a tf.cond
  (a function of its own, looked into)."""

  def __init__(self, draw, **kwargs):
    super().__init__(**kwargs)
    self.draw = draw

  def call(self, x, training=False):
    if not training:
      return x
    return tf.cond(tf.reduce_sum(x) > -1e9, lambda: x + self.draw(x),
                   lambda: x)


@pytest.mark.parametrize("draw, op", [
    (lambda x: tf.random.uniform(tf.shape(x)), "tf.random.uniform"),
    (lambda x: tf.random.stateless_normal(tf.shape(x), seed=[1, 2]), None),
    (lambda x: keras.layers.GaussianNoise(0.1)(x, training=True), None),
])
def test_a_layers_call_is_looked_into(draw, op):
  """A layer of the user's own: its call's stateful op is found inside a
  tf.cond; stateless draws are not."""
  model = keras.Sequential([keras.Input((FEATURES,)), Noisy(draw),
                            keras.layers.Dropout(0.5),
                            keras.layers.Dense(1)], name="noisy")
  model.compile(optimizer="sgd", loss="mse")
  line = random_ops.note(step_optimizers.StepTrace(
      model, tf.distribute.get_strategy(), {},
      (tf.TensorSpec((BATCH, FEATURES)), tf.TensorSpec((BATCH, 1)))),
      model.layers)
  if op is None:
    assert line is None
  else:
    assert (f": the training call of model 'noisy' draws with {op} "
            "(test_random_ops.py:") in line, line


def test_a_call_state_updates_traced_is_read_from_its_graph(
    mirrored, monkeypatch):
  """At 2 replicas state_updates.traced has traced the training call of a
  model with a layer of its own: the note reads that graph (the same line)
  rather than tracing the call again."""
  from dist_keras.contract import model_calls  # pylint: disable=g-import-not-at-top
  from dist_keras.training import state_updates  # pylint: disable=g-import-not-at-top
  with mirrored.scope():
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        Noisy(lambda x: tf.random.uniform(tf.shape(x))),
        keras.layers.Dense(1)], name="noisy")
    model.compile(optimizer="sgd", loss="mse")
  spec = (tf.TensorSpec((BATCH // 2, FEATURES)),
          tf.TensorSpec((BATCH // 2, 1)))
  forward = state_updates.traced(model, model.layers, mirrored, spec)
  traces = []
  traced = model_calls.traced
  monkeypatch.setattr(model_calls, "traced",
                      lambda *a: traces.append(a) or traced(*a))
  step = step_optimizers.StepTrace(model, mirrored, {}, spec)
  line = random_ops.note(step, model.layers, forward)
  assert not traces
  assert line == random_ops.note(step, model.layers)
  assert len(traces) == 1
  assert "draws with tf.random.uniform" in line, line


class Drawing(keras.Model):
  """Its own train_step adds noise drawn with `draw(self, shape)`."""

  def __init__(self, draw):
    super().__init__()
    self.draw = draw
    self.dense = keras.layers.Dense(1)
    self.generator = tf.random.Generator.from_seed(7)
    self.seed_generator = keras.random.SeedGenerator(3)

  def call(self, x):
    return self.dense(x)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
          (self.dense(x + self.draw(self, tf.shape(x))) - y) ** 2)
    weights = self.trainable_variables
    self.optimizer.apply(tape.gradient(loss, weights), weights)
    return {"loss": loss}


class NoisyLoss(keras.Model):
  """Keras' train_step; its own compute_loss draws with tf.random."""

  def __init__(self):
    super().__init__()
    self.dense = keras.layers.Dense(1)

  def call(self, x):
    return self.dense(x)

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                   training=True):
    noise = tf.random.normal(tf.shape(y_pred))
    return tf.reduce_mean((y_pred + noise - y) ** 2)


@pytest.mark.parametrize("model, said", [
    # Keras' global SeedGenerator (no seed=): resumed after step 4 of 8,
    # 0.49 off the uninterrupted run (2026-12-07).
    (lambda: Drawing(lambda self, s: keras.random.normal(s)),
     ("pass seed=self.seed_generator, a keras.random.SeedGenerator made in "
      "__init__, to keras.random.normal: Drawing.train_step draws from a "
      "seed state outside the model (Keras' global without seed=; "
      "test_random_ops.py:")),
    # Its state a tf.Variable the checkpoint does not keep: 0.31 off.
    (lambda: Drawing(lambda self, s: self.generator.uniform(s)),
     ("use keras.random.uniform(..., seed=self.seed_generator), a "
      "keras.random.SeedGenerator made in __init__: Drawing.train_step "
      "draws with a tf.random.Generator (test_random_ops.py:")),
    # Under Keras' train_step: 0.43 off.
    (NoisyLoss,
     ("use keras.random.normal(..., seed=self.seed_generator), a "
      "keras.random.SeedGenerator made in __init__: NoisyLoss.compute_loss"
      " or call draws with tf.random.normal (test_random_ops.py:")),
    # Resumed exactly: the same draw every step, or the model's state.
    (lambda: Drawing(lambda self, s: keras.random.normal(s, seed=5)), None),
    (lambda: Drawing(lambda self, s: keras.random.normal(
        s, seed=self.seed_generator)), None),
])
def test_draws_from_a_state_no_checkpoint_keeps_are_said(model, said):
  """Keras' global SeedGenerator, a tf.random.Generator, and tf.random in
  an own compute_loss: each said with its fix first; draws from a seed
  the model holds, or from an int seed, not."""
  model = model()
  model.compile(optimizer="sgd", loss="mse")
  model(np.zeros((BATCH, FEATURES), "float32"))
  with process_state.seeded(0):  # Keras' global SeedGenerator put back.
    line = random_ops.note(step_optimizers.StepTrace(
        model, tf.distribute.get_strategy(), {"optimizer": model.optimizer},
        (tf.TensorSpec((BATCH, FEATURES)), tf.TensorSpec((BATCH, 1)))),
        model.layers)
  if said is None:
    assert line is None, line
  else:
    assert line is not None and line.startswith(said), line


def test_keras_random_without_a_seed_at_2_replicas_is_refused_at_start(
    mirrored):
  """Keras keeps its global SeedGenerator per thread: each replica's thread
  made its state inside the traced step, and step 1 failed with
  TensorFlow's "singleton tf.Variables" traceback (Keras' fit under
  MirroredStrategy fails the same way). Refused at start in one line, the
  fix first, naming the draw's place."""
  with mirrored.scope():
    model = Drawing(lambda self, s: keras.random.normal(s))
    model.compile(optimizer="sgd", loss="mse")
    model(np.zeros((BATCH, FEATURES), "float32"))
  spec = (tf.TensorSpec((BATCH // 2, FEATURES)),
          tf.TensorSpec((BATCH // 2, 1)))
  with process_state.seeded(0), pytest.raises(UserError) as e:
    random_ops.note(step_optimizers.StepTrace(
        model, mirrored, {"optimizer": model.optimizer}, spec), model.layers)
  assert str(e.value).startswith(
      "pass seed=self.seed_generator, a keras.random.SeedGenerator made in "
      "__init__, to keras.random.*: Drawing draws without seed= "
      "(test_random_ops.py:"), str(e.value)
  assert "at 2 replicas" in str(e.value)
