"""Models Keras 3's TensorFlow backend cannot trace, on which Keras' fit
fails alike (contract/traced_limits.py): a name TensorFlow refuses for a
name scope, a RematScope that rematerializes a call taking keywords. Each
is refused in one line with nothing left in the workdir, and no run leaves
Keras' name-scope stack pushed for the process's next model.
"""
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
from dist_keras import installation
from dist_keras.contract import probe, traced_limits
from dist_keras.errors import UserError

CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": 2, "train.log_every": 2,
          "train.checkpoint_every": 2, "eval.every": 0,
          "log.calibration_steps": 0, "log.peak_tflops": 1.0,
          "log.progress": False}
ONE = tf.distribute.InputContext()


def _next_models_path() -> str:
  """The first variable path of a model built now: Keras names it under
  every name scope its stack holds."""
  model = keras.Sequential([keras.Input((2,)),
                            keras.layers.Dense(1, name="after")],
                           name="next_model")
  return model.variables[0].path


def _keras_fit_error(model_fn):
  """What Keras' fit of one step raises on one device (None: it trained),
  Keras' name-scope stack put back after it."""
  model = model_fn()
  try:
    with installation.keras_name_scopes_kept():
      model.fit(parity_task.dataset_fn("train", ONE), steps_per_epoch=1,
                verbose=0, shuffle=False)
  except ValueError as e:
    return str(e)
  return None


class _Net(keras.Model):  # Keras names it '__net', after its class.
  """A model class named with a leading '_' (a module's private class)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.out = keras.layers.Dense(1)

  def call(self, x):
    return self.out(x)


def _private_model():
  model = _Net()
  model.compile(optimizer="sgd", loss="mse")
  return model


class _Block(keras.layers.Layer):
  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], 4))

  def call(self, x):
    return x @ self.w


class Blocks(keras.Model):
  """Its layer '__block' is inside the model's scope in a step, but at the
  outermost scope of the graph Keras' shape inference traces `call` in."""

  def __init__(self):
    super().__init__(name="blocks")
    self.block, self.out = _Block(), keras.layers.Dense(1)

  def call(self, x):
    return self.out(self.block(x))


def _blocks():
  model = Blocks()
  model.compile(optimizer="sgd", loss="mse")
  return model


class _SquaredErrorStep(keras.Model):
  """A train_step of its own that calls `self.net` itself, at the step's
  outermost scope (a subclass sets it)."""

  def call(self, x):
    return self.net(x)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(self.net(x) - y))
    variables = self.net.trainable_variables
    self.optimizer.apply(tape.gradient(loss, variables), variables)
    return {"loss": loss}


class OwnStep(_SquaredErrorStep):
  """Its step calls a network named '_inner'."""

  def __init__(self):
    super().__init__(name="own_step")
    self.net = keras.Sequential(
        [keras.Input((parity_task.FEATURES,)), keras.layers.Dense(1)],
        name="_inner")


def _own_step():
  model = OwnStep()
  model.compile(optimizer="sgd", loss="mse")
  return model


def test_a_model_named_with_a_leading_underscore_is_refused_at_start(
    tmp_path):
  """Keras' fit fails on it and leaves '__net' on Keras' stack; dist_keras
  refuses it before the batches are read, names the model and the fix,
  leaves no workdir, and the next model's variables are named as usual."""
  assert "'__net' is not a valid root scope name" in _keras_fit_error(
      _private_model)
  read = []

  def dataset_fn(split, context):
    read.append(split)
    return parity_task.dataset_fn(split, context)

  with pytest.raises(UserError) as e:
    helpers.fit_fns(_private_model, dataset_fn, tmp_path / "w", CONFIG)
  # (Keras numbers the names of a class's later models: '__net_1'.)
  assert re.match(r"model '__net(_\d+)?' \(class _Net\) cannot be ",
                  str(e.value)), e.value
  assert re.search(r"pass it a name such as name='net(_\d+)?' ",
                   str(e.value))
  assert read == [] and not os.path.exists(tmp_path / "w")
  assert _next_models_path() == "next_model/after/kernel"


def test_a_layer_its_own_train_step_calls_at_the_root_is_said_at_step_1(
    tmp_path):
  assert "'_inner' is not a valid root scope name" in _keras_fit_error(
      _own_step)
  with pytest.raises(UserError) as e:
    helpers.fit_fns(_own_step, parity_task.dataset_fn, tmp_path / "w",
                    CONFIG)
  assert str(e.value).startswith(
      "layer '_inner' of model 'own_step' (class Sequential) cannot be ")
  assert "pass it a name such as name='inner'" in str(e.value)
  assert not os.path.exists(tmp_path / "w")
  assert _next_models_path() == "next_model/after/kernel"


class OwnStepKerasEval(_SquaredErrorStep):
  """Its step calls its layer; its eval is Keras' test_step, which calls
  the model by its name, `name`."""

  def __init__(self, name):
    super().__init__(name=name)
    self.net = keras.layers.Dense(1)


def _own_step_keras_eval(name):
  def model_fn():
    model = OwnStepKerasEval(name)
    model.compile(optimizer="sgd", loss="mse")
    return model
  return model_fn


def test_an_own_train_steps_eval_keras_cannot_trace_is_refused_at_start(
    tmp_path):
  """Its train_step traces; Keras' evaluate fails on the model's name, so
  the first eval would refuse it after training steps (a checkpoint each
  here): it is refused before step 1, naming the eval."""
  model = _own_step_keras_eval("own step")()
  with pytest.raises(ValueError, match="'own step' is not a valid"):
    with installation.keras_name_scopes_kept():
      model.evaluate(parity_task.dataset_fn("eval", ONE), steps=1, verbose=0)
  with pytest.raises(UserError) as e:
    helpers.fit_fns(_own_step_keras_eval("own step"), parity_task.dataset_fn,
                    tmp_path / "w", {**CONFIG, "train.checkpoint_every": 1})
  assert str(e.value).startswith(
      "model 'own step' (class OwnStepKerasEval) cannot be traced: "
      "TensorFlow refuses 'own step' as a name scope where Keras' test_step "
      "(the eval) calls it"), e.value
  assert not os.path.exists(tmp_path / "w")  # Not a step trained.
  assert _next_models_path() == "next_model/after/kernel"
  # A leading '_' is a name the eval takes (it calls the model inside its
  # loop over the batches, not at a graph's root): it trains, evaluated.
  result = helpers.fit_fns(_own_step_keras_eval("_own"),
                           parity_task.dataset_fn, tmp_path / "ok", CONFIG)
  assert np.isfinite(result.summary["eval_loss"])


def test_a_layer_named_with_a_leading_underscore_trains_and_leaves_no_scope(
    tmp_path):
  """Built from its zero batch, Keras' shape inference of it fails (and
  the probe calls it instead): the run trains, and neither the run's own
  variables nor the next model's are named under '__block'."""
  result = helpers.fit_fns(_blocks, parity_task.dataset_fn, tmp_path / "w",
                           CONFIG)
  assert np.isfinite(result.summary["train_loss"])
  # (Keras numbers a name taken before in the process: "__block_3".)
  assert re.fullmatch(r"blocks(_\d+)?/__block(_\d+)?/variable(_\d+)?",
                      result.model.variables[0].path)
  assert _next_models_path() == "next_model/after/kernel"


class ScopedStep(keras.Model):
  """A train_step of its own that calls the model inside a name scope,
  where fit trains a class named with a leading '_' as any other. Its call
  counts its training calls in a variable of `aggregation` and adds a
  penalty that is a mean or a sum (`how`) over the batch."""

  def __init__(self, aggregation="mean", how="mean"):
    super().__init__()
    self.how, self.out = how, keras.layers.Dense(1)
    self.count = self.add_weight(shape=(), initializer="zeros",
                                 trainable=False, aggregation=aggregation,
                                 name="count")

  def call(self, x, training=None):
    if training:
      self.count.assign_add(1.0)
    reduce = keras.ops.mean if self.how == "mean" else keras.ops.sum
    self.add_loss(1e-3 * reduce(keras.ops.square(x)))
    return self.out(x)

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      with tf.name_scope("step"):
        y_pred = self(x, training=True)
      loss = self.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
    self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                         self.trainable_variables)
    return {"loss": loss}


class _ScopedStep(ScopedStep):
  """The same, named '__scoped_step' by Keras."""


def _scoped(cls, names=None, loss="mse", **kwargs):
  def model_fn():
    model = cls(**kwargs)
    model.compile(optimizer="sgd", loss=loss)
    if names is not None:
      names.append(model.name)
    return model
  return model_fn


@pytest.mark.parametrize("aggregation, how, refused", [
    ("sum", "mean", "variable 'MODEL/count' has aggregation=\"sum\" and "),
    ("mean", "sum", ("the own loss of layer 'MODEL' (add_loss in its "
                     "call) sums over the batch"))],
    ids=["sum_variable", "summed_add_loss"])
def test_an_own_steps_model_named_with_a_leading_underscore_is_checked(
    tmp_path, mirrored, aggregation, how, refused):
  """The start's checks of the model's call traced it at a graph's
  outermost scope, where TensorFlow refuses '__scoped_step': they were
  skipped, and 2 replicas trained it silently (its counter 6 after 2
  steps, one device's 2). Either name is now refused in the same line."""
  lines = []
  for cls in (ScopedStep, _ScopedStep):
    names = []
    with pytest.raises(UserError) as e:
      dist_keras.fit(_scoped(cls, names, aggregation=aggregation, how=how),
                     parity_task.dataset_fn, workdir=str(tmp_path / "w"),
                     config=CONFIG, strategy=mirrored)
    lines.append(str(e.value).replace(names[-1], "MODEL"))
    assert not os.path.exists(tmp_path / "w")
  assert lines[0].startswith(refused), lines[0]
  assert lines[1] == lines[0]


def test_an_own_steps_model_named_with_a_leading_underscore_is_evaluated(
    mirrored):
  """Keras' fit trains it (its step calls it inside a scope), and its eval
  (Keras' test_step) has its add_loss term to report, as the same model's
  of another name has; it was taken for a model without an eval."""
  assert _keras_fit_error(_scoped(_ScopedStep)) is None
  spec = (tf.TensorSpec([24, parity_task.FEATURES]), tf.TensorSpec([24, 1]))
  for cls in (ScopedStep, _ScopedStep):
    with mirrored.scope():
      model = _scoped(cls, loss=None)()
    assert probe.evaluates(model, mirrored, spec, spec), cls.__name__


REMAT = {"full": {}, "larger_than": {"output_size_threshold": 4},
         "list_of_layers": {"layer_names": ["hidden"]}}


def _remat_model_fn(mode):
  def model_fn():
    with keras.RematScope(mode=mode, **REMAT.get(mode, {})):
      model = keras.Sequential([
          keras.Input((parity_task.FEATURES,)),
          keras.layers.Dense(8, activation="relu", name="hidden"),
          keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model
  return model_fn


@pytest.mark.parametrize("mode", sorted(REMAT))
def test_keras_fit_fails_on_a_rematscope_but_activations(mode):
  """What the refusals below rest on: if a Keras release traces these,
  this fails, and the refusal should go."""
  assert ("custom_gradient decorator currently supports keywords"
          in _keras_fit_error(_remat_model_fn(mode)))
  assert _keras_fit_error(_remat_model_fn("activations")) is None


@pytest.mark.parametrize("mode,who,read", [
    ("full", "model 'sequential'", []),  # At start: no batch read.
    ("larger_than", "model 'sequential'", ["train", "eval"]),
    ("list_of_layers", "layer 'hidden' of model 'sequential'",
     ["train", "eval"]),
])
def test_a_rematscope_keras_cannot_trace_is_refused_in_one_line(
    tmp_path, mode, who, read):
  seen = []

  def dataset_fn(split, context):
    seen.append(split)
    return parity_task.dataset_fn(split, context)

  with pytest.raises(UserError) as e:
    helpers.fit_fns(_remat_model_fn(mode), dataset_fn, tmp_path / "w",
                    CONFIG)
  assert re.match(re.escape(who).replace("sequential", r"sequential(_\d+)?")
                  + re.escape(f" was built inside keras.RematScope(mode="
                              f"{mode!r}), "), str(e.value)), e.value
  assert "use keras.RematScope(mode='activations')" in str(e.value)
  assert "\n" not in str(e.value)
  assert seen == read and not os.path.exists(tmp_path / "w")


def test_a_rematscope_of_activations_trains(tmp_path):
  result = helpers.fit_fns(_remat_model_fn("activations"),
                           parity_task.dataset_fn, tmp_path / "w", CONFIG)
  assert np.isfinite(result.summary["train_loss"])


def test_other_errors_are_not_taken_for_a_limit():
  model = _blocks()
  assert traced_limits.fault(ValueError("shapes (2, 3) and (4,)"),
                             model) is None
  assert traced_limits.fault(TypeError("'x' is not a valid scope name"),
                             model) is None
