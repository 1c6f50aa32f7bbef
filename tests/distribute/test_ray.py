"""Ray Train sees a run (dist_keras/training/ray_report.py).

CI (seconds): no session -> no action and no import of Ray; inside a fake
Ray Train session, a one-device run reports every checkpoint and epoch end
(not every log window) with the chief's checkpoint of that step, named as
in summary.json; the report's wait is not step time; a relative workdir is
refused before anything is written.
Slow (minutes, needs `pip install "ray[train]"`): a local Ray cluster's
TensorflowTrainer of 2 CPU workers running examples/ray_train.py: Ray sees
the metrics and checkpoints; a worker SIGKILLed mid-run -> Ray restarts the
group -> the final weights equal the uninterrupted run's bitwise.
"""
import json
import os
import signal
import sys
import time
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
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

  def __init__(self, rank, keep_to: str = "", wait: float = 0.0):
    super().__init__("ray.train")
    self.rank, self.keep_to, self.reports = rank, keep_to, []
    self.wait = wait  # Seconds each report takes (Ray's controller's poll).
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
    time.sleep(self.wait)


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


def test_reports_at_checkpoints_and_evals_not_every_log_window():
  """Each report after the first waits for Ray's controller (up to 2 s):
  a log window alone is not reported."""
  run = actions.RunState(Schedule(steps=12, log_every=2, eval_every=6,
                                  checkpoint_every=4), 0)
  sent = []
  action = ray_report.ReportToRay(
      run, types.SimpleNamespace(saved_at=None, folder="unused"), True,
      lambda m, checkpoint: sent.append(m["step"]), lambda folder: folder)
  for step in range(1, 13):
    run.step = step
    action.at(step, epoch_end=step % 6 == 0)
  assert sent == [4, 6, 8, 12]  # Checkpoints at 4 and 8; evals at 6, 12.


def test_the_wait_for_ray_is_not_step_time(tmp_path, monkeypatch):
  ray = FakeRayTrain(0, keep_to=str(tmp_path / "ray"), wait=0.5)
  monkeypatch.setitem(sys.modules, "ray.train", ray)
  summary = helpers.fit_fns(
      user_task.model_fn, user_task.dataset_fn, tmp_path / "run",
      {**CONFIG, "train.steps": 12, "train.log_every": 2,
       "train.checkpoint_every": 2, "eval.every": 12}).summary
  assert len(ray.reports) == 6
  # Counted in, each 0.5 s report would add 250 ms to a step of the
  # 2-step window after it (every window past the warm-up one).
  assert summary["step_ms_median"] < 100, summary


@pytest.mark.parametrize("rank", [0, 1])
def test_a_relative_workdir_is_refused_inside_a_ray_worker(
    tmp_path, monkeypatch, rank):
  """Ray moves each worker's current folder into its session's: a
  relative workdir would be written there and never resumed."""
  ray = FakeRayTrain(rank)
  monkeypatch.setitem(sys.modules, "ray.train", ray)
  monkeypatch.chdir(tmp_path)
  with pytest.raises(dist_keras.UserError) as e:
    helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                    os.path.join("runs", "rel"), CONFIG)
  assert str(e.value) == (
      "workdir='runs/rel' is relative, and Ray Train moves each worker's "
      f"current folder (here {tmp_path}): the run would be written there "
      "and a rerun would not resume it; pass os.path.abspath('runs/rel') "
      "from the driver, before Trainer.fit.")
  assert not os.listdir(tmp_path) and not ray.reports


@pytest.mark.parametrize("outside", [RuntimeError("outside"), None, "gone"])
def test_a_relative_workdir_outside_ray_train_is_left_alone(monkeypatch,
                                                            outside):
  if outside == "gone":
    monkeypatch.delitem(sys.modules, "ray.train", raising=False)
  else:
    monkeypatch.setitem(sys.modules, "ray.train", FakeRayTrain(outside))
  ray_report.check_workdir("runs/rel")  # Raises nothing.


def test_a_gs_workdir_inside_a_ray_worker_is_left_alone(monkeypatch):
  monkeypatch.setitem(sys.modules, "ray.train", FakeRayTrain(0))
  ray_report.check_workdir("gs://bucket/runs/rel")  # Raises nothing.


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


# The slow set: a local Ray cluster of 2 CPUs, examples/ray_train.py's
# TensorflowTrainer of 2 workers (MultiWorkerMirroredStrategy).
STEPS = 300  # Checkpoints at 100, 200, 300; evals at 200 and 300.


def _example():
  """examples/ray_train.py as a module Ray pickles by value (its workers
  cannot import it by name)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "ray_train_example", os.path.join(helpers.REPO, "examples",
                                        "ray_train.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


class KillOnce(keras.callbacks.Callback):
  """Writes "RANK STEP" where each attempt starts; on Ray rank `victim`,
  SIGKILLs its own process at step `at` unless `marker` exists (so only
  the first attempt dies)."""

  def __init__(self, folder: str, victim: int | None, at: int):
    super().__init__()
    self.folder, self.victim, self.at = folder, victim, at

  def _rank(self):
    import ray.train  # pylint: disable=g-import-not-at-top
    return ray.train.get_context().get_world_rank()

  def on_train_begin(self, logs=None):
    with open(os.path.join(self.folder, "starts"), "a",
              encoding="utf-8") as f:
      f.write(f"{self._rank()} {int(self.model.optimizer.iterations.numpy())}\n")

  def on_train_batch_end(self, batch, logs=None):
    marker = os.path.join(self.folder, "killed")
    if (self._rank() == self.victim and batch + 1 >= self.at
        and not os.path.exists(marker)):
      open(marker, "w", encoding="utf-8").close()
      os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def local_ray():
  """examples/ray_train.py as a module, on a local Ray cluster of 2 CPUs."""
  ray = pytest.importorskip("ray")
  pytest.importorskip("ray.train.tensorflow")
  example = _example()
  ray.cloudpickle.register_pickle_by_value(example)
  ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
  # Ray's own folder, not the tests' TMPDIR (conftest.py): its sockets'
  # paths there passed AF_UNIX's 107 bytes.
  ray.init(num_cpus=2, include_dashboard=False, _temp_dir="/tmp/ray")
  try:
    yield example
  finally:
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_runs(local_ray, tmp_path_factory):
  """An uninterrupted run and one whose worker 1 is killed at step 150
  (max_failures=1): {name: (result, folder)}."""
  root = tmp_path_factory.mktemp("ray")
  runs = {}
  for name, victim in (("whole", None), ("cut", 1)):
    folder = root / name
    folder.mkdir()
    result = local_ray.trainer(
        str(folder / "workdir"), str(root / "storage" / name), 2, STEPS,
        max_failures=1, callbacks=[KillOnce(str(folder), victim, 150)]).fit()
    runs[name] = (result, folder)
  return runs


@pytest.mark.slow
def test_a_relative_workdir_fails_the_ray_run_with_its_line(local_ray,
                                                             tmp_path):
  """A real Ray Train worker's current folder is Ray's, not the driver's:
  the relative workdir is refused there, and the driver's error says so."""
  from ray import train  # pylint: disable=g-import-not-at-top
  from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=g-import-not-at-top
  trainer = TensorflowTrainer(
      local_ray.train_loop_per_worker,
      train_loop_config={"workdir": "runs/rel", "steps": 4},
      scaling_config=train.ScalingConfig(num_workers=2),
      run_config=train.RunConfig(
          storage_path=str(tmp_path / "storage"),
          failure_config=train.FailureConfig(max_failures=0)))
  with pytest.raises(Exception) as e:
    trainer.fit()
  assert ("workdir='runs/rel' is relative, and Ray Train moves each "
          "worker's current folder (here /") in str(e.value)
  assert "pass os.path.abspath('runs/rel') from the driver" in str(e.value)


@pytest.mark.slow
def test_ray_sees_the_metrics_and_checkpoints(ray_runs):
  result, folder = ray_runs["whole"]
  summary = json.loads((folder / "workdir" / "summary.json").read_text())
  assert summary["strategy"] == "MultiWorkerMirroredStrategy"
  assert summary["replicas"] == 2
  metrics = result.metrics
  assert metrics["step"] == STEPS
  for name in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy"):
    assert metrics[name] == pytest.approx(summary[name], rel=1e-6), name
  assert metrics["examples_per_sec"] > 0
  assert metrics["eval_accuracy"] > 0.61  # Better than always 'outside'.
  with result.checkpoint.as_directory() as kept:
    assert tf.train.latest_checkpoint(kept).endswith(f"ckpt-{STEPS}")


@pytest.mark.slow
def test_a_killed_worker_restarts_and_ends_bitwise_equal(ray_runs):
  (whole, whole_folder), (cut, cut_folder) = ray_runs["whole"], ray_runs["cut"]
  assert (cut_folder / "killed").exists()
  starts = sorted((cut_folder / "starts").read_text().split("\n")[:-1])
  assert starts == ["0 0", "0 100", "1 0", "1 100"]  # Resumed at ckpt-100.
  assert cut.metrics["step"] == whole.metrics["step"] == STEPS
  expected = _final_weights(whole_folder / "workdir")
  got = _final_weights(cut_folder / "workdir")
  assert expected.keys() == got.keys()
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def _final_weights(workdir):
  """Every model and optimizer variable of the last checkpoint."""
  reader = tf.train.load_checkpoint(str(workdir / "checkpoints"))
  names = [n for n in reader.get_variable_to_shape_map()
           if n.startswith(("model_variables/", "optimizer_variables/"))]
  assert names
  return {n: reader.get_tensor(n) for n in names}
