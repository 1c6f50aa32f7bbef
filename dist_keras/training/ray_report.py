"""Ray Train sees the run: inside a Ray Train worker (`dist_keras.fit` as a
TensorflowTrainer's train_loop_per_worker), every log window's and every
epoch end's values, and each checkpoint dist_keras saves, go to
`ray.train.report`, so `result.metrics`, `result.checkpoint`, Ray's
dashboard and Tune see them.

Ray requires every worker to call report the same number of times (it is a
barrier): every worker reports at the same boundaries (log steps and epoch
ends, decided by the schedule alone). Only the chief holds the real
checkpoint files (the other workers' saves go to scratch folders), so it
alone passes a checkpoint; Ray registers a checkpoint when any worker
passes one, and keeps the metrics of world rank 0, the chief under the
TF_CONFIG Ray writes. Resuming needs nothing from Ray: a restarted worker
group reruns `dist_keras.fit` with the same workdir, which resumes from
its checkpoints.

Nothing here imports Ray: a process where `ray.train` was never imported
cannot be a Ray Train worker.
"""
import numbers
import os
import sys
import tempfile

import tensorflow as tf

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


def for_session(run: actions.RunState, checkpoints, chief: bool) -> list:
  """[the report action] inside a Ray Train session, else []."""
  train = session()
  if train is None:
    return []
  return [ReportToRay(run, checkpoints, chief, train.report,
                      train.Checkpoint.from_directory)]


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
  """At every log step and epoch end (after its eval and checkpoint): the
  values to `report`, with the checkpoint saved at this step from the
  chief."""

  def __init__(self, run: actions.RunState, checkpoints, chief: bool,
               report, make_checkpoint):
    super().__init__(run)
    self.checkpoints, self.chief = checkpoints, chief
    self.report, self.make_checkpoint = report, make_checkpoint
    self.reported = False

  def at(self, step: int, epoch_end: bool) -> None:
    if epoch_end or self.run.schedule.logs(step):
      self.send(metrics(step, self.run, self.run.final_eval if epoch_end
                        else None), step)

  def on_train_end(self, logs=None):
    # A rerun that resumed where training had ended passes no boundary:
    # Ray still gets the final eval and checkpoint.
    if not self.reported:
      self.send(metrics(self.run.step, self.run, self.run.final_eval),
                self.run.step)

  def send(self, values: dict, step: int) -> None:
    """Reports `values`, with the chief's checkpoint of `step` if saved."""
    self.reported = True
    if not (self.chief and self.checkpoints.saved_at == step):
      self.report(values, checkpoint=None)
      return
    with tempfile.TemporaryDirectory(prefix="dist_keras_ray_") as folder:
      copy_checkpoint(os.path.join(self.checkpoints.folder, f"ckpt-{step}"),
                      folder)
      # Ray persists it to its storage before report returns (its
      # default, synchronous upload), so the folder may go.
      self.report(values, checkpoint=self.make_checkpoint(folder))
