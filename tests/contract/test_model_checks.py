"""What dist_keras checks and builds of a user's model before its first
step (contract/checks.py, contract/saving.py), against Keras' fit: the
models Keras saves are found savable, a model is built
as fit builds it (symbolically: its call runs no extra time), and a model
with no compiled loss trains and evaluates on its own losses as under fit
(and one with no loss at all is refused, as fit fails on it).
"""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
import user_task
from dist_keras import origins
from dist_keras.contract import saving

STEPS = 4
CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": STEPS, "train.log_every": STEPS,
          "train.checkpoint_every": STEPS, "eval.every": 0,
          "log.calibration_steps": 0, "log.peak_tflops": 1.0,
          "log.progress": False}
ONE = tf.distribute.InputContext()


def _fit(model_fn, dataset_fn, validate=True):
  """Keras' fit of STEPS steps on one device, seeded as dist_keras seeds
  (runtime.seed 0)."""
  keras.utils.set_random_seed(0)
  model = model_fn()
  history = model.fit(dataset_fn("train", ONE), epochs=1,
                      steps_per_epoch=STEPS, verbose=0, shuffle=False,
                      validation_data=(dataset_fn("eval", ONE) if validate
                                       else None))
  return model, history.history


# --- Models Keras saves (one it cannot: test_unsavable_models.py) ---------

@pytest.mark.parametrize("model_fn", [
    parity_task.plain, parity_task.ema, parity_task.loss_scale,
    parity_task.schedule, parity_task.weight_decay, parity_task.custom_step,
    parity_task.custom_loss, parity_task.custom_test_step,
    parity_task.two_output, parity_task.gan,
    parity_task.call_without_training, user_task.model_fn,
    user_task.subclassed_model_fn, user_task.binary_model_fn],
                         ids=lambda fn: fn.__name__)
def test_the_models_keras_saves_pass_the_save_check(model_fn):
  assert saving.unsavable(model_fn()) is None


# --- No compiled loss: the model's own losses ------------------------------

class Reconstruct(keras.Model):
  """loss=None: its only loss is the add_loss term of its call. Built by
  model.build(shape), which leaves its Dense layers unbuilt (as Keras
  warns) until the model is called."""

  def __init__(self):
    super().__init__()
    self.encode = keras.layers.Dense(3, activation="tanh")
    self.decode = keras.layers.Dense(parity_task.FEATURES)

  def call(self, x):
    reconstructed = self.decode(self.encode(x))
    self.add_loss(tf.reduce_mean(tf.square(reconstructed - x)))
    return reconstructed


def _built_by_shape(model_class=None):
  model = (model_class or Reconstruct)()
  model.build((None, parity_task.FEATURES))
  model.compile(optimizer=keras.optimizers.SGD(0.1))
  return model


@pytest.mark.filterwarnings("ignore:`build\\(\\)` was called")
def test_a_model_built_by_shape_with_only_its_own_loss_trains_as_fit(
    tmp_path):
  """Its layers were left unbuilt (no variables to train: the first step
  failed in apply_gradients)."""
  fitted, history = _fit(_built_by_shape, parity_task.images_dataset_fn,
                         validate=False)
  result = helpers.fit_fns(_built_by_shape, parity_task.images_dataset_fn,
                           tmp_path, CONFIG)
  assert len(result.model.trainable_variables) == 4
  assert result.summary["train_loss"] == pytest.approx(history["loss"][-1],
                                                       rel=1e-6)
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_allclose(a, b, atol=1e-6)


class AddLoss(keras.layers.Layer):
  """Adds the reconstruction error of its first input to the model's loss."""

  def call(self, reconstructed, x):
    self.add_loss(tf.reduce_mean(tf.square(reconstructed - x)))
    return reconstructed


def _functional_add_loss():
  inputs = keras.Input((parity_task.FEATURES,))
  hidden = keras.layers.Dense(3, activation="tanh")(inputs)
  reconstructed = keras.layers.Dense(parity_task.FEATURES)(hidden)
  model = keras.Model(inputs, AddLoss()(reconstructed, inputs))
  model.compile(optimizer=keras.optimizers.SGD(0.1))
  return model


def test_a_model_with_only_its_own_loss_is_evaluated_as_keras_evaluates(
    tmp_path):
  """Keras' fit reports its val_loss and evaluate() its loss; the run had
  said "no eval" (so an EarlyStopping on val_loss never saw one)."""
  _, history = _fit(_functional_add_loss, parity_task.images_dataset_fn)
  result = helpers.fit_fns(_functional_add_loss,
                           parity_task.images_dataset_fn, tmp_path, CONFIG)
  _assert_evaluated_as_keras_evaluates(result)
  assert result.history["val_loss"] == pytest.approx(history["val_loss"],
                                                     rel=1e-5)


def _assert_evaluated_as_keras_evaluates(result):
  """The run's eval_loss is Keras' evaluate() of its model on the split."""
  x, _ = parity_task._examples("eval")  # pylint: disable=protected-access
  evaluated = result.model.evaluate(x, batch_size=len(x), verbose=0,
                                    return_dict=True)
  assert result.summary["eval_loss"] == pytest.approx(evaluated["loss"],
                                                      rel=1e-5)
  assert result.summary["eval_examples"] == len(x)


class ReconstructByItsOwnStep(Reconstruct):
  """Its own train_step, on the add_loss term of its call (logged as
  'recon'); no compiled loss, no test_step of its own."""

  def train_step(self, x):
    with tf.GradientTape() as tape:
      self(x, training=True)
      loss = tf.add_n(self.losses)
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"recon": loss}


def _own_step_add_loss():
  return _built_by_shape(ReconstructByItsOwnStep)


@pytest.mark.filterwarnings("ignore:`build\\(\\)` was called")
def test_an_own_train_step_on_its_add_loss_is_evaluated_as_keras_evaluates(
    tmp_path):
  """Keras' evaluate() reports the add_loss term as 'loss' (its test_step
  finds it in model.losses) and fit's history has val_loss beside the
  step's 'recon'; the run had said "no eval"."""
  fitted, history = _fit(_own_step_add_loss, parity_task.images_dataset_fn)
  result = helpers.fit_fns(_own_step_add_loss,
                           parity_task.images_dataset_fn, tmp_path, CONFIG)
  assert set(result.history) == set(history) == {"recon", "val_loss"}
  for name, values in history.items():
    np.testing.assert_allclose(result.history[name], values, rtol=1e-5,
                               err_msg=name)
  _assert_evaluated_as_keras_evaluates(result)
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_gan_with_no_loss_of_its_own_has_no_eval(tmp_path):
  """Keras' evaluate() fails on it (its call does not take the real
  samples; it has no loss), so the run has no eval."""
  x, _ = parity_task._examples("eval")  # pylint: disable=protected-access
  with pytest.raises(ValueError):
    parity_task.gan().evaluate(x, verbose=0)
  result = helpers.fit_fns(parity_task.gan, parity_task.images_dataset_fn,
                           tmp_path, CONFIG)
  assert not [k for k in result.summary if k.startswith("eval_")]
  assert set(result.history) == {"d_loss", "g_loss"}


def _no_loss(regularizer=None):
  def model_fn():
    model = keras.Sequential(
        [keras.Input((parity_task.FEATURES,)),
         keras.layers.Dense(1, use_bias=False, kernel_regularizer=regularizer)],
        name="no_loss")
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model
  return model_fn


def test_a_model_with_no_loss_at_all_is_refused_before_anything_is_written(
    tmp_path):
  """compile(loss=None), no add_loss, no regulariser: Keras' fit fails at
  its first step ("No loss to compute"), and so had the run, after writing
  its workdir. A regulariser is a loss of its own: that model trains as
  under fit."""
  with pytest.raises(ValueError, match="No loss to compute"):
    _fit(_no_loss(), parity_task.dataset_fn)
  with pytest.raises(dist_keras.UserError) as e:
    helpers.fit_fns(_no_loss(), parity_task.dataset_fn, tmp_path / "run",
                    CONFIG)
  message = str(e.value)
  assert message.startswith(
      "model 'no_loss' has no loss to train on: it was compiled without a "
      "loss and adds none of its own"), message
  assert "compile the model with a loss= or add_loss()" in message
  assert "\n" not in message
  assert not (tmp_path / "run").exists()
  _, history = _fit(_no_loss("l2"), parity_task.dataset_fn)
  result = helpers.fit_fns(_no_loss("l2"), parity_task.dataset_fn,
                           tmp_path / "l2", CONFIG)
  assert result.summary["train_loss"] == pytest.approx(history["loss"][-1],
                                                       rel=1e-5)
  assert result.history["val_loss"] == pytest.approx(history["val_loss"],
                                                     rel=1e-5)


# --- Built as fit builds: no extra call -------------------------------------

class CountCalls(keras.layers.Layer):
  """Counts the batches its call runs on (a non-trainable weight)."""

  def build(self, input_shape):
    self.calls = self.add_weight(shape=(), initializer="zeros",
                                 trainable=False, name="calls")

  def call(self, x):
    self.calls.assign_add(1.0)
    return x


def _unbuilt_sequential():
  model = keras.Sequential([CountCalls(), keras.layers.Dense(1)])
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


def test_an_unbuilt_models_call_runs_as_often_as_under_fit(tmp_path):
  """fit builds an unbuilt model symbolically; the zero-batch probe had
  called it once eagerly, one count more than fit's (saved in model.keras).
  STEPS train batches and 5 eval batches (200 examples, 48 a batch)."""
  fitted, _ = _fit(_unbuilt_sequential, parity_task.dataset_fn)
  result = helpers.fit_fns(_unbuilt_sequential, parity_task.dataset_fn,
                           tmp_path, CONFIG)
  counts = [float(m.layers[0].calls.numpy()) for m in (fitted, result.model)]
  assert counts == [STEPS + 5] * 2
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _raising_model_fn():
  raise ValueError("bad layer width -3")


def _raising_dataset_fn(split, input_context):
  del input_context
  raise KeyError(split)


@pytest.mark.parametrize("model_fn,dataset_fn,where", [
    (_raising_model_fn, parity_task.dataset_fn,
     "raised in model_fn test_model_checks:_raising_model_fn"),
    (parity_task.plain, _raising_dataset_fn,
     "raised in dataset_fn('train', ...) test_model_checks:_raising_dataset_fn"),
])
def test_a_users_function_that_raises_is_named_in_its_error(
    tmp_path, model_fn, dataset_fn, where):
  """The caller gets their own exception, marked with where it came from
  (the command line's one line says it: origins.unexpected), and nothing is
  written."""
  with pytest.raises((ValueError, KeyError)) as raised:
    helpers.fit_fns(model_fn, dataset_fn, tmp_path / "run", CONFIG)
  assert raised.value.__notes__ == [where]
  assert origins.unexpected(raised.value).endswith(f" ({where})")
  assert not os.path.exists(tmp_path / "run")


class _Finite(keras.layers.Layer):
  """A user's own check in a layer's call."""

  def call(self, x):
    return tf.debugging.check_numerics(x, "the model saw an inf")  # CHECK


def _finite_checked():
  model = keras.Sequential([keras.Input((parity_task.FEATURES,)), _Finite(),
                            keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  return model


def _inf_in_replica_1s_third_batch(split, ctx):
  """parity_task's train batches, with an inf in the 6th per-replica batch
  (one pipeline feeds both replicas: step 3's second)."""
  if split == "eval":
    return None
  return parity_task.dataset_fn(split, ctx).enumerate().map(
      lambda i, xy: (tf.where(i == 5, np.inf, xy[0]), xy[1]))


def test_a_check_in_the_users_own_layer_failing_mid_run_is_theirs(
    tmp_path, mirrored):
  """fit raises TF's error as it came; the command line's line names the
  user's line that made the failing op, not "unexpected", and a
  cluster's worker tells its peers of it (origins.users_own)."""
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    dist_keras.fit(_finite_checked, _inf_in_replica_1s_third_batch,
                   workdir=str(tmp_path), config=CONFIG, strategy=mirrored)
  line = next(n for n, text in enumerate(open(__file__), 1)
              if text.rstrip().endswith("# CHECK"))
  assert origins.users_own(raised.value)
  assert origins.unexpected(raised.value) == (
      "InvalidArgumentError: the model saw an inf : Tensor had Inf values "
      f"({origins.MADE_AT}{os.path.abspath(__file__)}:{line} in call)")


def test_a_layers_error_under_keras_wrapping_is_said_by_its_own_line():
  """Keras wraps an error a layer's call raises in "Exception encountered
  when calling Sequential.call()." (then the message, in bold, then the
  call's arguments): the one line says the layer's message."""
  model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, name="out")])
  with pytest.raises(ValueError) as raised:
    model(np.zeros((2, 50), "float32"))
  assert dist_keras.errors.first_line(raised.value) == (
      "in Sequential.call(): Input 0 with name 'None' of layer 'out' is "
      "incompatible with the layer: expected axis -1 of input shape to have "
      "value 6, but received input with shape (2, 50)")
