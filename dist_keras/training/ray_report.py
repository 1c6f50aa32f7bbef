"""Ray Train sees the run: inside a Ray Train worker (`dist_keras.fit` as a
TensorflowTrainer's train_loop_per_worker), each checkpoint dist_keras
saves and every epoch end's values, with the last log window's, go to
`ray.train.report`, so `result.metrics`, `result.checkpoint`, Ray's
dashboard and Tune see them.

Ray requires every worker to call report the same number of times (it is a
barrier): every worker reports at the same boundaries (checkpoint steps and
epoch ends, decided by the schedule alone). Not at every log window: each
report after the first waits until Ray's controller has taken the one
before (V2: a queue of one, polled every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S,
2 s by default), which held a fast model to a window per 2 s; that wait is
kept out of the timed window, as a checkpoint's save is. Only the chief
holds the real checkpoint files (the other workers' saves go to scratch
folders), so it alone passes a checkpoint; Ray registers a checkpoint when
any worker passes one, and keeps the metrics of world rank 0, the chief
under the TF_CONFIG Ray writes. Resuming needs nothing from Ray: a
restarted worker group reruns `dist_keras.fit` with the same workdir, which
resumes from its checkpoints. A relative workdir is refused there: Ray
moves each worker's current folder (check_workdir).

Nothing here imports Ray: a process where `ray.train` was never imported
cannot be a Ray Train worker.
"""
import numbers
import os
import sys
import tempfile

import tensorflow as tf

from dist_keras import validate
from dist_keras.errors import UserError
from dist_keras.training import actions


def session():
  """The `ray.train` module when this process is a Ray Train worker in a
  session, else None (Ray Train V2 raises outside a worker; V1's context
  answers rank None)."""
  train = sys.modules.get("ray.train")
  if train is None:
    return None
  try:
    rank = train.get_context().get_world_rank()
  except (RuntimeError, DeprecationWarning):
    # DeprecationWarning: V2 inside a Tune function, which reports through
    # ray.tune instead.
    return None
  return None if rank is None else train


def check_workdir(workdir: str) -> None:
  """Raises UserError for a relative workdir inside a Ray Train worker: Ray
  moves each worker's current folder into its own (V2:
  /tmp/ray/session_*/artifacts/<run>/), so the run would land there, not
  where the driver runs, and a rerun, in another session, would start at
  step 0 instead of resuming."""
  if not isinstance(workdir, (str, os.PathLike)):
    return  # Not a path at all: build's validate.workdir_named says so.
  path = os.fspath(workdir)
  if (not path or "://" in path or os.path.isabs(path)
      or session() is None):
    return
  raise UserError(
      f"{validate.named_workdir(workdir)} is relative, and Ray Train moves "
      f"each worker's current folder (here {os.getcwd()}): the run would be "
      "written there and a rerun would not resume it; pass "
      f"os.path.abspath({path!r}) from the driver, before Trainer.fit.")


def for_session(run: actions.RunState, checkpoints, chief: bool,
                meters=None) -> list:
  """[the report action] inside a Ray Train session, else []; `meters`
  (measure/meters.py) is paused while a report waits for Ray."""
  train = session()
  if train is None:
    return []
  return [ReportToRay(run, checkpoints, chief, train.report,
                      train.Checkpoint.from_directory, meters)]


def metrics(step: int, run: actions.RunState, eval_values: dict | None
            ) -> dict:
  """One report's values, named as in summary.json: step, train_NAME, the
  window's throughput (examples_per_sec, mfu, ...), its instrumented
  step's sync split (sync_fraction, allreduce_ms, step_ms, ...), and
  eval_NAME when an eval ran."""
  values = {"step": step}
  values.update({f"train_{k}": v for k, v in run.logged.items()})
  for tag, value in run.perf.items():
    group, _, name = tag.partition("/")
    # perf/step_ms is the window's wall time; summary.json's step_ms is the
    # instrumented step's, which sync/step_ms gives.
    if group == "perf" and name != "step_ms":
      values[name] = value
    elif group == "sync" and name == "fraction":
      values["sync_fraction"] = value
    elif group == "sync" and name.endswith("_ms"):
      values[name] = value
  if eval_values:
    values.update({f"eval_{k}": v for k, v in eval_values.items()})
  return {k: float(v) for k, v in values.items()
          if isinstance(v, numbers.Real)}


def copy_checkpoint(prefix: str, folder: str) -> None:
  """Copies checkpoint `prefix`'s files (from any tf.io.gfile path, gs://
  too) into `folder`, with a `checkpoint` file naming it: a folder that
  tf.train.latest_checkpoint reads, and dist_keras resumes from as a
  workdir's checkpoints/."""
  name = os.path.basename(prefix)
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.copy(path, os.path.join(folder, os.path.basename(path)))
  # The CheckpointState text proto that tf.train.CheckpointManager writes
  # (TF 2 exposes its writer only as tf.compat.v1).
  with tf.io.gfile.GFile(os.path.join(folder, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "{name}"\n'
            f'all_model_checkpoint_paths: "{name}"\n')


def report_kept(summary: dict, checkpoints, chief: bool) -> None:
  """A rerun of a finished workdir reports once, as its run last did: the
  kept summary's train and eval values, with the chief's checkpoint."""
  train = session()
  if train is None:
    return
  values = {"step": summary["steps"],
            **{k: v for k, v in summary.items()
               if k.startswith(("train_", "eval_"))}}
  ReportToRay(None, checkpoints, chief, train.report,
              train.Checkpoint.from_directory).send(
                  {k: float(v) for k, v in values.items()
                   if isinstance(v, numbers.Real)}, summary["steps"])


class ReportToRay(actions.Boundary):
  """At every checkpoint step and epoch end (after its eval and
  checkpoint): the last log window's values (and the eval's) to `report`,
  with the checkpoint saved at this step from the chief."""

  def __init__(self, run: actions.RunState, checkpoints, chief: bool,
               report, make_checkpoint, meters=None):
    super().__init__(run)
    self.checkpoints, self.chief = checkpoints, chief
    self.report, self.make_checkpoint = report, make_checkpoint
    self.meters = meters
    self.reported = False

  def at(self, step: int, epoch_end: bool) -> None:
    # Every checkpoint reaches Ray as it is saved (result.checkpoint, Ray's
    # checkpoint manager); the metrics ride along. A log window alone is not
    # reported: it would wait for Ray's controller (see the docstring).
    if epoch_end or self.run.schedule.checkpoints(step):
      self.send(metrics(step, self.run, self.run.final_eval if epoch_end
                        else None), step)

  def on_train_end(self, logs=None):
    # A rerun that resumed where training had ended passes no boundary:
    # Ray still gets the final eval and checkpoint.
    if not self.reported:
      self.send(metrics(self.run.step, self.run, self.run.final_eval),
                self.run.step)

  def send(self, values: dict, step: int) -> None:
    """Reports `values`, with the chief's checkpoint of `step` if saved;
    the meters paused meanwhile (the wait for Ray is not a step's time)."""
    self.reported = True
    if self.meters is not None:
      self.meters.pause()
    try:
      self._send(values, step)
    finally:
      if self.meters is not None:
        self.meters.resume()

  def _send(self, values: dict, step: int) -> None:
    if not (self.chief and self.checkpoints.saved_at == step):
      self.report(values, checkpoint=None)
      return
    with tempfile.TemporaryDirectory(prefix="dist_keras_ray_") as folder:
      copy_checkpoint(os.path.join(self.checkpoints.folder, f"ckpt-{step}"),
                      folder)
      # Ray persists it to its storage before report returns (its
      # default, synchronous upload), so the folder may go.
      self.report(values, checkpoint=self.make_checkpoint(folder))
