"""Ray Train sees a run (dist_keras/training/ray_report.py).

CI (seconds): no session -> no action and no import of Ray; inside a fake
Ray Train session, a one-device run reports every log window and epoch end
with the chief's checkpoint of that step, named as in summary.json.
Slow (minutes, needs `pip install "ray[train]"`): a local Ray cluster's
TensorflowTrainer of 2 CPU workers running examples/ray_train.py: Ray sees
the metrics and checkpoints; a worker SIGKILLed mid-run -> Ray restarts the
group -> the final weights equal the uninterrupted run's bitwise.
"""
import json
import os
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import helpers
import user_task
from dist_keras.training import actions, ray_report
from dist_keras.training.settings import Schedule

CONFIG = {"train.global_batch_size": user_task.GLOBAL_BATCH,
          "train.steps": 8, "train.log_every": 4,
          "train.checkpoint_every": 4, "eval.every": 6,
          "log.progress": False, "log.calibration_steps": 0}


class FakeRayTrain(types.ModuleType):
  """`ray.train` as a worker sees it: get_context, report (which copies a
  checkpoint away at once, as Ray's synchronous upload does), Checkpoint."""

  def __init__(self, rank, keep_to: str = ""):
    super().__init__("ray.train")
    self.rank, self.keep_to, self.reports = rank, keep_to, []
    self.Checkpoint = types.SimpleNamespace(from_directory=lambda path: path)

  def get_context(self):
    if isinstance(self.rank, Exception):
      raise self.rank
    return types.SimpleNamespace(get_world_rank=lambda: self.rank)

  def report(self, metrics, checkpoint=None):
    kept = None
    if checkpoint is not None:
      kept = os.path.join(self.keep_to, str(len(self.reports)))
      tf.io.gfile.makedirs(kept)
      for name in os.listdir(checkpoint):
        tf.io.gfile.copy(os.path.join(checkpoint, name),
                         os.path.join(kept, name))
    self.reports.append((dict(metrics), kept))


def _run_state(steps=8):
  return actions.RunState(Schedule(steps=steps, log_every=4, eval_every=8,
                                   checkpoint_every=4), 0)


def test_no_ray_train_imported_no_action_and_no_import(monkeypatch):
  for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
    monkeypatch.delitem(sys.modules, name)
  assert ray_report.for_session(_run_state(), None, True) == []
  assert not [m for m in sys.modules if m == "ray" or m.startswith("ray.")]


@pytest.mark.parametrize("outside", [
    RuntimeError("`get_context` cannot be used outside of a Ray Train "
                 "training function."),  # Ray Train V2.
    None])  # V1: a context whose rank is None outside a session.
def test_ray_imported_outside_a_worker_no_action(monkeypatch, outside):
  monkeypatch.setitem(sys.modules, "ray.train", FakeRayTrain(outside))
  assert ray_report.for_session(_run_state(), None, True) == []


def test_a_run_reports_every_window_with_the_chief_checkpoint(
    tmp_path, monkeypatch):
  ray = FakeRayTrain(0, keep_to=str(tmp_path / "ray"))
  monkeypatch.setitem(sys.modules, "ray.train", ray)
  result = helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                           tmp_path / "run", CONFIG)
  # Log steps 4 and 8, epoch ends (evals) at 6 and 8: step 8 reports once,
  # after its eval.
  assert [m["step"] for m, _ in ray.reports] == [4, 6, 8]
  (first, first_ckpt), (middle, middle_ckpt), (last, last_ckpt) = ray.reports
  assert "train_loss" in first and "train_mae" in first
  assert not [k for k in first if k.startswith("eval_")]
  assert "eval_loss" in middle and middle_ckpt is None  # Not saved at 6.
  summary = result.summary
  for name in ("train_loss", "train_mae", "eval_loss", "eval_mae",
               "eval_examples"):
    assert last[name] == pytest.approx(summary[name], rel=1e-6), name
  assert tf.train.latest_checkpoint(first_ckpt).endswith("ckpt-4")
  # The copy is the workdir's checkpoint, tensor for tensor.
  copy = tf.train.load_checkpoint(tf.train.latest_checkpoint(last_ckpt))
  saved = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints"))
  names = saved.get_variable_to_shape_map()
  assert names == copy.get_variable_to_shape_map()
  for name in names:
    np.testing.assert_array_equal(copy.get_tensor(name),
                                  saved.get_tensor(name), err_msg=name)


def test_a_rerun_with_nothing_left_reports_once(tmp_path, monkeypatch):
  helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                  tmp_path / "run", CONFIG)
  ray = FakeRayTrain(0, keep_to=str(tmp_path / "ray"))
  monkeypatch.setitem(sys.modules, "ray.train", ray)
  helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                  tmp_path / "run", CONFIG)
  [(metrics, kept)] = ray.reports
  assert metrics["step"] == 8 and "eval_loss" in metrics
  assert tf.train.latest_checkpoint(kept).endswith("ckpt-8")


def test_other_workers_report_as_often_without_a_checkpoint():
  calls = {True: [], False: []}
  for chief in (True, False):
    run = _run_state(steps=12)
    checkpoints = types.SimpleNamespace(saved_at=None, folder="unused")
    action = ray_report.ReportToRay(
        run, checkpoints, chief,
        lambda m, checkpoint, c=chief: calls[c].append((m["step"],
                                                        checkpoint)),
        lambda folder: folder)
    for step in range(1, 13):
      run.step = step
      action.at(step, epoch_end=step % 8 == 0 or step == 12)
  assert [s for s, _ in calls[True]] == [s for s, _ in calls[False]] == [
      4, 8, 12]
  assert all(c is None for _, c in calls[False])
