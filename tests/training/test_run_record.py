"""What a checkpoint keeps beside the variables (run_record.py) and the
users' callbacks' state over a resume (callback_state.py). Resumes that
train with them, against uninterrupted runs: test_callbacks.py."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import user_task
from dist_keras.measure import flops
from dist_keras.training import callback_state, checkpoints, run_record

ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")


def _through_a_checkpoint(callbacks: list):
  """(record, arrays) as a checkpoint's restore gives them back."""
  saved = run_record.RunRecord()

  def snapshot():
    arrays = {}
    return {"callbacks": callback_state.states(callbacks, arrays)}, arrays

  saved.snapshot = snapshot
  restored = run_record.RunRecord()
  restored.deserialize(saved.serialize())
  return restored.restored


def test_keras_callbacks_state_goes_through_a_checkpoint_exactly(tmp_path):
  plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss")
  plateau.wait, plateau.best, plateau.cooldown_counter = 2, 0.1 + 0.2, 1
  best = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"),
                                         save_best_only=True)
  best.best, best._last_batch_seen = np.float32(0.7), 3  # pylint: disable=protected-access
  stop = keras.callbacks.EarlyStopping(restore_best_weights=True)
  stop.on_train_begin()
  weights = [np.random.default_rng(0).normal(size=(3, 2)).astype("float32"),
             np.arange(2, dtype="float32")]
  stop.wait, stop.best, stop.best_epoch, stop.best_weights = (
      1, float("inf"), 4, weights)
  record, arrays = _through_a_checkpoint([plateau, best, stop])
  fresh = [keras.callbacks.ReduceLROnPlateau(monitor="val_loss"),
           keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"),
                                           save_best_only=True),
           keras.callbacks.EarlyStopping(restore_best_weights=True)]
  for callback in fresh:
    callback.on_train_begin()  # Resets them: restore() comes after it.
  line = callback_state.restore(fresh, record["callbacks"], arrays)
  assert line == (
      "callbacks over the resume: kept ReduceLROnPlateau (wait=2, best=0.3, "
      "cooldown_counter=1), ModelCheckpoint (best=0.7, "
      "_batches_seen_since_last_saving=0, _last_batch_seen=3), "
      "EarlyStopping (wait=1, best=inf, best_epoch=4, stopped_epoch=0, "
      "best_weights)")
  assert (fresh[0].wait, fresh[0].best, fresh[0].cooldown_counter) == (
      2, 0.1 + 0.2, 1)
  assert fresh[1].best == np.float32(0.7) and fresh[1]._last_batch_seen == 3  # pylint: disable=protected-access
  assert (fresh[2].wait, fresh[2].best, fresh[2].best_epoch) == (
      1, float("inf"), 4)
  for got, want in zip(fresh[2].best_weights, weights, strict=True):
    np.testing.assert_array_equal(got, want)


class _Mine(keras.callbacks.Callback):
  pass


class _MyStopping(keras.callbacks.EarlyStopping):
  pass


def test_what_is_not_kept_is_named(tmp_path):
  """Another monitor, a checkpoint with no state of it, a callback of its
  own, a subclass's own attributes, a CSVLogger that rewrites its file;
  nothing said for callbacks that lose nothing."""
  record, arrays = _through_a_checkpoint(
      [keras.callbacks.EarlyStopping(monitor="val_loss")])
  now = [keras.callbacks.EarlyStopping(monitor="val_mae"),
         keras.callbacks.ReduceLROnPlateau(), _Mine(), _MyStopping(),
         keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
         keras.callbacks.CSVLogger(str(tmp_path / "log.csv"), append=True),
         keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate)]
  assert callback_state.restore(now, record["callbacks"], arrays) == (
      "callbacks over the resume: not kept: EarlyStopping (the checkpoint "
      "holds no state of it), ReduceLROnPlateau (the checkpoint holds no "
      "state of it), _Mine (its own attributes start as new), _MyStopping "
      "(the checkpoint holds no state of it), _MyStopping (its own "
      "attributes beyond its Keras class's start as new), CSVLogger "
      "(append=False: it writes its file again from this epoch, without "
      "the rows before)")
  assert callback_state.restore(now[-2:], None, {}) == ""


def test_a_checkpoint_without_a_record_is_finished_saying_what_is_unknown(
    tmp_path, monkeypatch, capsys):
  """A checkpoint saved before records were kept resumes, and the rerun
  that finishes it names every field it cannot know."""
  make = checkpoints.Checkpoints.__init__

  def without_a_record(self, *args, **kwargs):
    make(self, *args, **kwargs)
    self.checkpoint = tf.train.Checkpoint(**self._variables)  # pylint: disable=protected-access

  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 8, "train.log_every": 4, "eval.every": 0,
            "log.calibration_steps": 0, "log.peak_tflops": 1.0}
  with monkeypatch.context() as patched:
    patched.setattr(checkpoints.Checkpoints, "__init__", without_a_record)
    first = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                           workdir=str(tmp_path), config=config,
                           strategy=ONE_CPU)
  for name in ("summary.json", "model.keras"):
    os.remove(tmp_path / name)
  capsys.readouterr()
  again = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                         workdir=str(tmp_path), config=config,
                         strategy=ONE_CPU)
  assert set(again.summary) == set(first.summary) | {"finished_by_rerun"}
  unknown = again.summary["finished_by_rerun"]["not_known"]
  assert {"examples_per_sec", "step_ms_median", "train_loss",
          "tracing_calls_s"} <= set(unknown)
  assert all(again.summary[key] is None for key in unknown)
  assert again.summary["eval_loss"] == pytest.approx(
      first.summary["eval_loss"], rel=1e-6)
  out = capsys.readouterr().out
  assert "(its checkpoint keeps no measurements)" in out
  assert "(its last steps were not logged)" in out, out


def test_a_measurement_the_checkpoint_lacks_is_unknown_not_this_processs(
    tmp_path, monkeypatch, capsys):
  """A checkpoint saved by a dist_keras that did not time the peak twice
  (no peak_timed) is finished with the MFU and peak it kept, and
  peak_timed unknown: not this process's reading beside a peak that MFU
  was not divided by."""
  snapshot = run_record.Keep._snapshot  # pylint: disable=protected-access

  def without_peak_timed(self):
    record, arrays = snapshot(self)
    del record["measured"]["peak_timed"]
    return record, arrays

  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 8, "train.log_every": 2, "eval.every": 0,
            "log.calibration_steps": 0}  # The peak a timed matmul.
  with monkeypatch.context() as patched:
    patched.setattr(run_record.Keep, "_snapshot", without_peak_timed)
    first = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                           workdir=str(tmp_path), config=config,
                           strategy=ONE_CPU).summary
  assert first["peak_timed"] and first["mfu"]
  os.remove(tmp_path / "summary.json")
  capsys.readouterr()
  again = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                         workdir=str(tmp_path), config=config,
                         strategy=ONE_CPU).summary
  assert (again["peak_tflops"], again["mfu"]) == (first["peak_tflops"],
                                                  first["mfu"])
  assert again["peak_timed"] is None
  assert again["finished_by_rerun"]["not_known"] == ["peak_timed"]
  assert ("peak_timed (its checkpoint was saved by a dist_keras that did "
          "not keep them)") in capsys.readouterr().out


def test_a_rerun_keeps_the_flop_count_its_kept_mfu_is_of(
    tmp_path, monkeypatch):
  """Its own count (here one of twice the FLOPs: another data.seq_len
  counts so) stood beside the checkpoint's MFU, over the first count: the
  pair disagreed. FLOPs, MFU, throughput and peak are now one run's."""
  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 8, "train.log_every": 2, "eval.every": 0,
            "log.calibration_steps": 0, "log.peak_tflops": 1.0,
            "log.tensorboard": False, "log.progress": False}
  first = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                         workdir=str(tmp_path), config=config,
                         strategy=ONE_CPU).summary
  assert first["mfu"] and first["flops_per_example"]
  os.remove(tmp_path / "summary.json")
  count = flops.count
  monkeypatch.setattr(flops, "count", lambda *args: flops.FlopCount(
      2 * count(*args).forward))
  again = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                         workdir=str(tmp_path), config=config,
                         strategy=ONE_CPU).summary
  assert "finished_by_rerun" in again
  for key in ("flops_per_example", "mfu", "examples_per_sec", "peak_tflops"):
    assert again[key] == first[key], key
  assert again["mfu"] == pytest.approx(
      again["flops_per_example"] * again["examples_per_sec"]
      / (again["peak_tflops"] * 1e12), rel=1e-9)
