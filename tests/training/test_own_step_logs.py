"""A model's own train_step and test_step returning values of their own,
not (or not only) its metrics': reported as Keras' fit reports them, in
History, the callbacks' logs and summary.json.

Keras' fit and evaluate report a step's last logs where their names differ
from the model's metrics (_get_metrics_result_or_logs). The run had read
such a name from Keras' own loss tracker, which the step never updated:
`loss` 0.0 beside an own train_step's loss, `val_loss` 0.0 in place of an
own test_step's values (which an EarlyStopping on val_loss then stopped
on).

3 epochs of 4 steps of 48; the eval split's 200 examples end with a step
of 8, which at 2 replicas (per-replica batches of 24) all fall to one
replica: the other runs a zero example that must weigh nothing.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras

FEATURES, GLOBAL_BATCH = 6, 48
CONFIG = {"train.steps": 12, "train.global_batch_size": GLOBAL_BATCH,
          "eval.every": 4, "train.log_every": 4, "log.calibration_steps": 0,
          "log.tensorboard": False}


def _examples(split):
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  n = {"train": 480, "eval": 200}[split]
  x = rng.normal(size=(n, FEATURES)).astype("float32")
  y = x @ np.linspace(-1.0, 1.0, FEATURES) + 0.1 * rng.normal(size=n)
  return x, y.astype("float32")[:, None]


def dataset_fn(split, input_context):
  ds = tf.data.Dataset.from_tensor_slices(_examples(split))
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    return ds.repeat().batch(batch, drop_remainder=True)
  return ds.batch(batch)


class OwnTestStep(keras.Model):
  """Its test_step returns a value of its own and updates no metric."""

  def test_step(self, data):
    x, y = data
    return {"raw_mse": tf.reduce_mean(tf.square(self(x) - y))}


class OwnTrainStep(keras.Model):
  """Its train_step returns its loss as "loss" (Keras' loss tracker's
  name; the tracker is never updated) and its gradients' norm; counts
  its traces."""

  traces = 0

  def train_step(self, data):
    OwnTrainStep.traces += 1  # Python runs only as a step function traces.
    x, y = data
    with tf.GradientTape() as tape:
      loss = self.compute_loss(y=y, y_pred=self(x, training=True))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"loss": loss, "gnorm": tf.linalg.global_norm(grads)}


def _model_fn(model_class):
  def model_fn():
    inputs = keras.Input((FEATURES,))
    model = model_class(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model
  return model_fn


class Recorder(keras.callbacks.Callback):
  """Every hook's logs, by hook (and batch)."""

  def __init__(self):
    super().__init__()
    self.logs, self.epoch = {}, None

  def _keep(self, key, logs):
    self.logs[key] = {k: np.asarray(v) for k, v in (logs or {}).items()}

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    self._keep(("batch", self.epoch, batch), logs)

  def on_test_end(self, logs=None):
    self._keep(("test", len(self.logs)), logs)

  def on_epoch_end(self, epoch, logs=None):
    self._keep(("epoch", epoch), logs)


def _keras_fit(model_fn, callbacks, strategy=None):
  """Keras' fit on the same batches from the same seed (under `strategy`:
  its global batches are split as dist_keras' replicas read them)."""
  keras.utils.set_random_seed(0)
  with (strategy or tf.distribute.get_strategy()).scope():
    model = model_fn()
  one = tf.distribute.InputContext()
  return model.fit(dataset_fn("train", one), epochs=3, steps_per_epoch=4,
                   validation_data=dataset_fn("eval", one), verbose=0, shuffle=False,
                   callbacks=callbacks).history


def _ours(tmp_path, model_fn, strategy, callbacks):
  return dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path),
                        config=CONFIG, strategy=strategy, callbacks=callbacks)


def _assert_same(ours: dict, theirs: dict, rtol: float) -> None:
  assert set(ours) == set(theirs)
  for name, values in theirs.items():
    np.testing.assert_allclose(ours[name], values, rtol=rtol, atol=1e-7,
                               err_msg=name)


def _stop():
  return keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)


@pytest.mark.filterwarnings("ignore:Early stopping conditioned on metric")
@pytest.mark.parametrize("replicas", [1, 2])
def test_an_own_test_steps_values_are_reported_as_fit_reports_them(
    tmp_path, mirrored, replicas):
  """Its last batch's raw_mse, as val_raw_mse (no val_loss: fit's
  EarlyStopping on it warns and trains all 3 epochs, as the run now
  does); at 2 replicas each replica's value weighed by its examples, so
  the last step's mean is one device's."""
  model_fn = _model_fn(OwnTestStep)
  fitted = _keras_fit(model_fn, [_stop()])
  recorder = Recorder()
  result = _ours(tmp_path, model_fn,
                 "one_device" if replicas == 1 else mirrored,
                 [_stop(), recorder])
  _assert_same(result.history, fitted, 1e-6 if replicas == 1 else 1e-5)
  assert result.summary["steps"] == 12
  assert "eval_loss" not in result.summary
  assert result.summary["eval_raw_mse"] == result.history["val_raw_mse"][-1]
  tests = [logs for key, logs in recorder.logs.items() if key[0] == "test"]
  assert [float(logs["raw_mse"]) for logs in tests] == result.history[
      "val_raw_mse"]
  assert all(set(logs) == {"raw_mse"} for logs in tests)


@pytest.mark.parametrize("replicas", [1, 2])
def test_an_own_train_steps_loss_is_reported_as_fit_reports_it(
    tmp_path, mirrored, replicas):
  """Its last step's loss and gradient norm, in History and in every
  batch's logs, as fit's under the same strategy (at 2 replicas each
  replica's loss is its share, Keras' loss divided by 2, and the logs
  their mean: fit's own). The step traces once a replica in each of the
  run's two step functions (the plain one's loop starts from the timed
  one's logs, not from a step traced outside it) and once in the start's
  look for stateful random ops (random_ops): three, not four."""
  model_fn = _model_fn(OwnTrainStep)
  strategy = None if replicas == 1 else mirrored
  theirs = Recorder()
  fitted = _keras_fit(model_fn, [theirs], strategy)
  recorder = Recorder()
  OwnTrainStep.traces = 0
  result = _ours(tmp_path, model_fn, strategy or "one_device", [recorder])
  assert OwnTrainStep.traces == 3 * replicas
  _assert_same(result.history, fitted, 1e-6 if replicas == 1 else 1e-5)
  assert result.summary["train_loss"] == pytest.approx(
      result.history["loss"][-1])
  ours = {key: logs for key, logs in recorder.logs.items()
          if key[0] == "batch"}
  assert len({key[1] for key in ours}) == 3  # (Not every batch: per call.)
  for key, logs in ours.items():
    _assert_same(logs, theirs.logs[key], 1e-6 if replicas == 1 else 1e-5)
