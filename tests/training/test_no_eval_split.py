"""A dataset_fn whose eval split is None trains as Keras' fit trains
without validation_data: no eval, epochs of eval.every steps whose logs
hold the train values only, one device = fit, 2 replicas = one device,
resumed = uninterrupted; what contradicts it is refused in one line."""
import os
import warnings

import helpers
import keras
import numpy as np
import parity_task
import pytest
import tensorflow as tf

import dist_keras
from dist_keras.errors import UserError

EPOCH, EPOCHS = 3, 2
CONFIG = {**parity_task.short_run(EPOCH * EPOCHS), "eval.every": EPOCH}


def _weights(model) -> list:
  return [w.numpy() for w in model.weights]


class EpochEnds(keras.callbacks.Callback):
  """The logs of every epoch end it sees."""

  def __init__(self):
    super().__init__()
    self.logs = []

  def on_epoch_end(self, epoch, logs=None):
    self.logs.append(dict(logs))


@pytest.fixture(scope="module")
def keras_fit():
  """Keras' fit on the same batches, without validation data."""
  keras.utils.set_random_seed(0)
  model = parity_task.plain()
  history = model.fit(
      parity_task.dataset_fn("train", tf.distribute.InputContext()),
      epochs=EPOCHS, steps_per_epoch=EPOCH, verbose=0, shuffle=False)
  return _weights(model), history.history


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  return dist_keras.fit(
      parity_task.plain, parity_task.train_only_dataset_fn,
      workdir=str(tmp_path_factory.mktemp("one")), config=CONFIG,
      strategy="one_device")


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, mirrored):
  """2 replicas, with a callback that records the epoch ends and Keras'
  two that monitor val_loss: (result, the recorder, the warnings)."""
  ends = EpochEnds()
  best = str(tmp_path_factory.mktemp("best") / "best.keras")
  callbacks = [ends, keras.callbacks.EarlyStopping("val_loss", patience=0),
               keras.callbacks.ModelCheckpoint(best, "val_loss",
                                               save_best_only=True)]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = dist_keras.fit(
        parity_task.plain, parity_task.train_only_dataset_fn,
        workdir=str(tmp_path_factory.mktemp("two")), config=CONFIG,
        strategy=mirrored, callbacks=callbacks)
  return result, ends, [str(w.message) for w in caught], best


def test_one_device_trains_what_fit_trains_without_validation_data(
    keras_fit, one_device):
  weights, history = keras_fit
  for got, expected in zip(_weights(one_device.model), weights, strict=True):
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
  assert sorted(one_device.history) == sorted(history) == ["loss", "mae"]
  for key, values in history.items():
    np.testing.assert_allclose(one_device.history[key], values, rtol=1e-6)
  summary = one_device.summary
  assert summary["steps"] == EPOCH * EPOCHS and "train_loss" in summary
  assert not [k for k in summary if k.startswith("eval")]


def test_two_replicas_train_what_one_device_trains(one_device, two_replicas):
  result = two_replicas[0]
  for got, expected in zip(_weights(result.model),
                           _weights(one_device.model), strict=True):
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
  assert sorted(result.history) == ["loss", "mae"]
  np.testing.assert_allclose(result.history["loss"],
                             one_device.history["loss"], rtol=1e-5)


def test_callbacks_see_epoch_ends_without_val_keys_as_under_fit(
    two_replicas):
  result, ends, caught, best = two_replicas
  assert [sorted(logs) for logs in ends.logs] == [["loss", "mae"]] * EPOCHS
  # As under fit without validation data: each warns, none stops or fails.
  assert result.summary["steps"] == EPOCH * EPOCHS
  assert not result.summary["stopped_early"]
  assert sum("Early stopping conditioned on metric `val_loss` which is not"
             " available" in w for w in caught) == EPOCHS
  assert sum("Can save best model only with val_loss available" in w
             for w in caught) == EPOCHS
  assert os.path.exists(best)


def test_a_named_dataset_fn_without_eval_resumes_as_uninterrupted(
    tmp_path, capsys, one_device):
  """The command line's path (names, as data.name=PKG.MODULE:FN), killed
  after its first epoch's checkpoint and run again."""
  config = {**CONFIG, "log.progress": True, "train.checkpoint_every": EPOCH}
  names = ("parity_task:plain", "parity_task:train_only_dataset_fn")
  dist_keras.fit(*names, workdir=str(tmp_path), config=config,
                 strategy="one_device")
  first = capsys.readouterr().out
  helpers.as_if_killed_after(tmp_path, EPOCH, EPOCH * EPOCHS)
  result = dist_keras.fit(*names, workdir=str(tmp_path), config=config,
                          strategy="one_device")
  again = capsys.readouterr().out
  for out in (first, again):
    assert sum(line.startswith("no eval split: dataset_fn('eval', ...) "
                               "returned None") for line in
               out.splitlines()) == 1, out
    assert "eval at step" not in out
  assert f"resumed from ckpt-{EPOCH} at step {EPOCH}" in again, again
  for got, expected in zip(_weights(result.model),
                           _weights(one_device.model), strict=True):
    np.testing.assert_array_equal(got, expected)
  assert list(result.history) == ["loss", "mae"]
  np.testing.assert_allclose(result.history["loss"],
                             one_device.history["loss"][1:], rtol=1e-6)
  assert not [k for k in result.summary if k.startswith("eval")]
  # Killed after its last checkpoint, before its results: the rerun
  # writes them, and runs no eval.
  for name in ("model.keras", "summary.json"):
    os.remove(tmp_path / name)
  dist_keras.fit(*names, workdir=str(tmp_path), config=config,
                 strategy="one_device")
  [line] = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("results written by this rerun")]
  assert "eval" not in line, line
  assert (tmp_path / "summary.json").exists()


def _none_for_pipeline(none_id):
  def dataset_fn(split, input_context):
    if split == "eval" and input_context.input_pipeline_id == none_id:
      return None
    return parity_task.dataset_fn(split, input_context)
  return dataset_fn


@pytest.mark.parametrize("dataset_fn,config,message", [
    (parity_task.train_only_dataset_fn, {"eval.steps": 2},
     (r"^eval.steps=2 but dataset_fn\('eval', ...\) returned None \(no eval "
      r"split\), so it would be ignored; drop eval.steps")),
    (_none_for_pipeline(0), {"data.pipeline_per_replica": True},
     (r"^dataset_fn\('eval', ...\) returned None for input pipeline 0 but a "
      r"tf.data.Dataset for another of this worker's; return None for every")),
    (_none_for_pipeline(1), {"data.pipeline_per_replica": True},
     (r"^dataset_fn\('eval', ...\) returned None for input pipeline 1 but a "
      r"tf.data.Dataset for another")),
], ids=["eval_steps", "pipeline_0_none", "pipeline_1_none"])
def test_what_contradicts_no_eval_split_is_refused_in_one_line(
    tmp_path, mirrored, dataset_fn, config, message):
  workdir = tmp_path / "run"
  with pytest.raises(UserError, match=message) as refused:
    dist_keras.fit(parity_task.plain, dataset_fn, workdir=str(workdir),
                   config={**CONFIG, **config}, strategy=mirrored)
  assert "\n" not in str(refused.value)
  assert not workdir.exists() or not os.listdir(workdir)
