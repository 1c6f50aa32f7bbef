"""What workers compare of the models their model_fn built
(training/same_model.py): what defines the training counts, auto names do
not. (Two workers refusing different models: test_multi_worker.py.)"""
import json

import keras
import pytest
import tensorflow as tf

import user_task
from dist_keras import errors
from dist_keras.contract import checks
from dist_keras.training import same_model


def _model(activation="tanh", loss="mse", units=16, **optimizer):
  inputs = keras.Input((user_task.FEATURES,))
  x = keras.layers.Dense(units, activation=activation)(inputs)
  model = keras.Model(inputs, keras.layers.Dense(1)(x))
  model.compile(optimizer=keras.optimizers.Adam(**optimizer), loss=loss,
                metrics=["mae", keras.metrics.AUC()])
  return model


def _difference(a, b) -> dict:
  """{part: (first differing key, a's, b's)} of two models' fingerprints."""
  a, b = same_model.fingerprint(a), same_model.fingerprint(b)
  plain = lambda value: json.loads(json.dumps(value))  # noqa: E731
  return {part: same_model._first_difference(plain(a[part]), plain(b[part]))  # pylint: disable=protected-access
          for part in a if a[part] != b[part]}


def test_the_same_model_built_twice_is_the_same_whatever_its_auto_names():
  """The second build names its layers dense_2, dense_3 and its metric
  auc_1, as a worker's script that built another model first would."""
  first, second = _model(), _model()
  assert first.layers[1].name != second.layers[1].name
  assert _difference(first, second) == {}
  assert _difference(user_task.model_fn(), user_task.model_fn()) == {}


@pytest.mark.parametrize("changed, part, found", [
    ({"activation": "relu"}, "architecture",
     ("layers[1].config.activation", "tanh", "relu")),
    ({"loss": "mae"}, "loss and metrics", ("loss", "mse", "mae")),
    ({"beta_1": 0.5}, "optimizer", ("beta_1", 0.9, 0.5))])
def test_what_defines_the_training_differs_by_part_and_key(
    changed, part, found):
  assert _difference(_model(), _model(**changed)) == {part: found}


def test_other_shapes_differ_in_the_weights_too():
  difference = _difference(_model(), _model(units=8))
  assert set(difference) == {"architecture", "weights' shapes"}
  assert difference["architecture"] == ("layers[1].config.units", 16, 8)


class _Sized(keras.Model):
  """A subclassed model of a given width."""

  def __init__(self, units):
    super().__init__()
    self.hidden = keras.layers.Dense(units, activation="tanh")
    self.out = keras.layers.Dense(1)

  def call(self, x):
    return self.out(self.hidden(x))


def _built(model):
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  model(keras.ops.zeros((1, user_task.FEATURES)))
  return model


def test_a_subclassed_model_counts_by_its_class_and_weights():
  """Keras' get_config of a subclassed model says little of its layers
  (its constructor's arguments, if any)."""
  assert _difference(_built(user_task.Subclassed()),
                     _built(user_task.Subclassed())) == {}
  assert _difference(_built(_Sized(16)), _built(_Sized(16))) == {}
  assert "weights' shapes" in _difference(_built(_Sized(16)),
                                          _built(_Sized(8)))
  assert same_model.fingerprint(_built(_Sized(8)))["architecture"][
      "class"] == "test_same_model._Sized"


def test_weights_of_other_shapes_than_another_workers_are_one_line():
  """As MultiWorkerMirroredStrategy sends worker 0's initial values while
  model_fn makes its variables (TF 2.21's text): it said
  'InvalidArgumentError: Collective ops is aborted by: Shape mismatch in
  the collective instance 101. Op at device ...' (exit 1), or its peer
  lost it (exit 200)."""
  def model_fn():
    raise tf.errors.InvalidArgumentError(None, None, (
        "Collective ops is aborted by: Shape mismatch in the collective "
        "instance 101. Op at device /job:worker/replica:0/task:1/device:"
        "CPU:0 expected shape [8,16] but another member in the group "
        "expected shape [8,32]. This is likely due to different input "
        "shapes at different members of the collective op."))

  with pytest.raises(errors.UserError) as raised, same_model.shapes_said():
    checks.call_model_fn(model_fn, tf.distribute.get_strategy(), "float32")
  assert str(raised.value).startswith(
      "the workers' model_fn built weights of different shapes ([8,16] on "
      "worker:1, [8,32] on another worker); build and compile the same "
      "model on every worker")

  def other_model_fn():
    raise tf.errors.InvalidArgumentError(None, None, "another error")

  with pytest.raises(tf.errors.InvalidArgumentError), same_model.shapes_said():
    checks.call_model_fn(other_model_fn, tf.distribute.get_strategy(),
                         "float32")
