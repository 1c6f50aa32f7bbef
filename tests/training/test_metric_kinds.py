"""Metrics and model state of every kind Keras' fit takes, at 2 replicas: a
metric whose result() returns its variable, a metric of a value per class,
and a layer whose inference updates a variable of aggregation "mean"
(which synchronises the replicas inside the eval step).

The eval split (37 examples in per-replica batches of 8) leaves one replica
an empty batch at the last step.
"""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
# Keras' own log conversion, the reference for what a History holds.
from keras.src.utils import python_utils

import dist_keras
import helpers
import parity_task
from dist_keras.training import metrics

GLOBAL_BATCH = 16
CLASSES = 4
SIZES = {"train": 160, "eval": 37}
CONFIG = {"train.global_batch_size": GLOBAL_BATCH, "train.steps": 10,
          "train.log_every": 5, "train.checkpoint_every": 10,
          "eval.every": 0, "log.calibration_steps": 0,
          "log.sync_timing": False, "log.peak_tflops": 1.0}


def _examples(split, onehot):
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.normal(size=(SIZES[split], 5)).astype("float32")
  y = np.argmax(x[:, :CLASSES] + rng.normal(size=(len(x), CLASSES)), 1)
  if onehot:
    return x, np.eye(CLASSES, dtype="float32")[y]
  return x, y[:, None].astype("int32")


def _dataset_fn(onehot):
  def dataset_fn(split, input_context):
    ds = tf.data.Dataset.from_tensor_slices(_examples(split, onehot))
    batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    if split == "train":
      return ds.repeat().batch(batch, drop_remainder=True)
    return ds.batch(batch)
  return dataset_fn


class CategoricalTruePositives(keras.metrics.Metric):
  """Keras' guide's custom metric as the guide writes it: its result() is
  its variable itself."""

  def __init__(self, name="categorical_true_positives", **kwargs):
    super().__init__(name=name, **kwargs)
    self.true_positives = self.add_variable(shape=(), name="ctp",
                                            initializer="zeros")

  def update_state(self, y_true, y_pred, sample_weight=None):
    y_pred = keras.ops.reshape(keras.ops.argmax(y_pred, axis=1), (-1, 1))
    values = keras.ops.cast(
        keras.ops.cast(y_true, "int32") == keras.ops.cast(y_pred, "int32"),
        "float32")
    self.true_positives.assign_add(keras.ops.sum(values))

  def result(self):
    return self.true_positives

  def reset_state(self):
    self.true_positives.assign(0.0)


def _counting_model_fn():
  model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(CLASSES)])
  model.compile(
      optimizer=keras.optimizers.SGD(0.05),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[CategoricalTruePositives(), "sparse_categorical_accuracy"])
  return model


def test_a_metric_whose_result_is_its_variable_counts_each_window(
    tmp_path, mirrored):
  """It counts the hits accuracy counts: each log window's own (it had
  read the run's total, and crashed at 2 replicas)."""
  result = dist_keras.fit(_counting_model_fn, _dataset_fn(onehot=False),
                          workdir=str(tmp_path), config=CONFIG,
                          strategy=mirrored)
  tags = helpers.scalar_tags(str(tmp_path))
  hits, accuracy = (tags[name] for name in (
      "categorical_true_positives", "sparse_categorical_accuracy"))
  assert [step for step, _ in hits] == [5, 10]
  for (_, count), (_, rate) in zip(hits, accuracy):
    assert count == pytest.approx(rate * 5 * GLOBAL_BATCH, abs=1e-3)
  history = result.history
  assert history["categorical_true_positives"][0] == pytest.approx(
      history["sparse_categorical_accuracy"][0] * SIZES["train"], abs=1e-3)
  assert history["val_categorical_true_positives"][0] == pytest.approx(
      history["val_sparse_categorical_accuracy"][0] * SIZES["eval"],
      abs=1e-3)
  assert result.summary["train_categorical_true_positives"] == hits[-1][1]


def _f1_model_fn():
  model = keras.Sequential([keras.Input((5,)),
                            keras.layers.Dense(8, activation="tanh"),
                            keras.layers.Dense(CLASSES, activation="softmax")])
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss="categorical_crossentropy",
                metrics=["accuracy", keras.metrics.F1Score(average=None)])
  return model


def _keras_fit_history(model_fn=_f1_model_fn):
  """Keras' fit on one device, on the same batches, from the same seed."""
  keras.utils.set_random_seed(0)
  model = model_fn()
  one = tf.distribute.InputContext()
  dataset_fn = _dataset_fn(onehot=True)
  return model.fit(dataset_fn("train", one), epochs=1, steps_per_epoch=10,
                   validation_data=dataset_fn("eval", one),
                   verbose=0, shuffle=False).history


@pytest.mark.parametrize("value", [np.float32(0.25), np.array(0.25),
                                   np.array([0.25]), np.array([0.25, 0.5])])
def test_a_value_is_logged_in_the_type_and_shape_fit_logs(value):
  """As Keras' fit pythonifies its logs: a one-class F1Score's (1,) stays
  an array (fit's History holds array([0.13]), not 0.13)."""
  fitted = python_utils.pythonify_logs({"m": value})["m"]
  ours = metrics.logged(value)
  assert type(ours) is type(fitted)
  assert np.shape(ours) == np.shape(fitted)
  np.testing.assert_array_equal(ours, fitted)


def test_a_metric_of_a_value_per_class_is_logged_as_fit_logs_it(
    tmp_path, mirrored, capsys):
  """F1Score(average=None): History and the callbacks' logs hold fit's
  arrays, summary.json lists, TensorBoard a scalar per class, the lines
  the values in brackets."""
  epoch_logs = []
  result = dist_keras.fit(
      _f1_model_fn, _dataset_fn(onehot=True), workdir=str(tmp_path),
      config={**CONFIG, "log.progress": True}, strategy=mirrored,
      callbacks=[keras.callbacks.LambdaCallback(
          on_epoch_end=lambda epoch, logs: epoch_logs.append(logs))])
  fitted = _keras_fit_history()
  assert set(result.history) == set(fitted)
  for name, values in fitted.items():
    np.testing.assert_allclose(result.history[name], values, rtol=1e-5,
                               atol=1e-6, err_msg=name)
  assert isinstance(result.history["val_f1_score"][0], np.ndarray)
  assert epoch_logs[0]["val_f1_score"].shape == (CLASSES,)
  x, y = _examples("eval", onehot=True)
  whole_split = keras.metrics.F1Score(average=None)
  whole_split.update_state(y, result.model(x))
  on_disk = json.loads((tmp_path / "summary.json").read_text())
  np.testing.assert_allclose(on_disk["eval_f1_score"], whole_split.result(),
                             rtol=1e-5)
  assert len(on_disk["train_f1_score"]) == CLASSES
  tags = helpers.scalar_tags(str(tmp_path))
  for k in range(CLASSES):
    assert [step for step, _ in tags[f"f1_score/{k}"]] == [5, 10]
    assert tags[f"f1_score/{k}"][-1][1] == pytest.approx(
        on_disk["train_f1_score"][k])
    assert tags[f"eval/f1_score/{k}"][0][1] == pytest.approx(
        on_disk["eval_f1_score"][k])
  out = capsys.readouterr().out
  assert "step 10/10  loss" in out and "  f1_score [0." in out
  assert "done: 10 steps, eval accuracy" in out


class OwnStep(keras.Model):
  """Keras' guide's own train_step, returning its metrics' values (a
  vector: F1Score(average=None)); with `confidence`, also a vector of its
  own, the mean predicted probability of each class."""

  confidence = False

  def train_step(self, data):
    logs, y_pred = parity_task.guide_train_step(self, data)
    if self.confidence:
      logs["confidence"] = tf.reduce_mean(y_pred, axis=0)
    return logs


class OwnStepWithConfidence(OwnStep):
  confidence = True


def _own_step_model_fn(model_class):
  def model_fn():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    model = model_class(inputs, keras.layers.Dense(
        CLASSES, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.F1Score(average=None)])
    return model
  return model_fn


@pytest.mark.parametrize("model_class", [OwnStep, OwnStepWithConfidence])
def test_a_vector_in_an_own_train_steps_logs_is_logged_as_fit_logs_it(
    tmp_path, model_class, capsys):
  """Its logs' vectors (the F1 of each class; the confidence of each)
  are fit's arrays in History, lists in summary.json, a scalar per
  element in TensorBoard (the run had failed at the first step: float()
  of the step's logs)."""
  model_fn = _own_step_model_fn(model_class)
  result = dist_keras.fit(model_fn, _dataset_fn(onehot=True),
                          workdir=str(tmp_path),
                          config={**CONFIG, "log.progress": True},
                          strategy="one_device")
  fitted = _keras_fit_history(model_fn)
  assert set(result.history) == set(fitted)
  for name, values in fitted.items():
    np.testing.assert_allclose(result.history[name], values, rtol=1e-5,
                               atol=1e-6, err_msg=name)
  vectors = ["f1_score"] + (["confidence"] if model_class.confidence else [])
  on_disk = json.loads((tmp_path / "summary.json").read_text())
  tags = helpers.scalar_tags(str(tmp_path))
  out = capsys.readouterr().out
  for name in vectors:
    assert result.history[name][0].shape == (CLASSES,)
    assert len(on_disk[f"train_{name}"]) == CLASSES
    assert [step for step, _ in tags[f"{name}/0"]] == [5, 10]
    assert tags[f"{name}/{CLASSES - 1}"][-1][1] == pytest.approx(
        on_disk[f"train_{name}"][-1])
    assert f"  {name} [0." in out


class CountsCalls(keras.layers.Layer):
  """Counts its calls, in inference too, in a variable of aggregation
  `aggregation` (an update that synchronises the replicas); refuses an
  empty batch, as TF 2.21's oneDNN convolutions do on AVX-512 hosts."""

  def __init__(self, aggregation, **kwargs):
    super().__init__(**kwargs)
    self.calls = self.add_weight(shape=(), initializer="zeros",
                                 trainable=False, aggregation=aggregation)

  def call(self, x):
    tf.debugging.assert_positive(tf.shape(x)[0], message="empty batch")
    self.calls.assign_add(1.0)
    return x


@pytest.mark.parametrize("aggregation", ["mean", "only_first_replica"])
def test_a_layer_updating_a_synchronised_variable_evaluates(mirrored,
                                                           aggregation):
  """3 examples in per-replica batches of 1: the second step leaves
  replica 1 empty. Every example counts once, no empty batch reaches the
  model, and the layer counts one call per step, as one device's model
  counts one per batch of 2 (it had failed: merge_call inside a tf.cond)."""
  with mirrored.scope():
    layer = CountsCalls(aggregation)
  x, y, model, result = helpers.eval_three_examples(mirrored, layer)
  assert (result["examples"], result["steps"]) == (3, 2)
  assert float(layer.calls.numpy()) == 2.0
  prediction = np.asarray(model(x))
  assert result["mae"] == pytest.approx(
      np.abs(prediction - y).mean(), rel=1e-6)
  assert result["loss"] == pytest.approx(
      np.square(prediction - y).mean(), rel=1e-6)


def test_an_own_steps_metric_beside_its_own_values_is_one_devices_at_2(
    tmp_path, mirrored):
  """A metric the step's logs name beside a value of their own is read
  from its state: the F1 of each class at 2 replicas is one device's (the
  replicas' mean of their own F1 scores is not)."""
  model_fn = _own_step_model_fn(OwnStepWithConfidence)
  runs = [dist_keras.fit(model_fn, _dataset_fn(onehot=True),
                         workdir=str(tmp_path / name), config=CONFIG,
                         strategy=strategy)
          for name, strategy in (("one", "one_device"), ("two", mirrored))]
  one, two = (run.summary["train_f1_score"] for run in runs)
  np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(runs[1].history["f1_score"],
                             runs[0].history["f1_score"], rtol=1e-5,
                             atol=1e-6)
