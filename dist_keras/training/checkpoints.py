"""The run's checkpoints: every model and optimizer variable, numbered by
step, in workdir/checkpoints.

Every worker takes part in a save (TF's multi-worker pattern), but only the
chief's lands in the workdir; the others write to a private temporary
folder, deleted by close(). Keras' BackupAndRestore is not worker-aware.
"""
import os
import shutil
import tempfile

import tensorflow as tf

from dist_keras.errors import UserError
from dist_keras.training import allreduce, run_files


def latest_step(workdir: str) -> int:
  """The step of the latest checkpoint in `workdir` (0: none).

  Checkpoints are numbered by step (ckpt-STEP), so the step is known before
  the model exists: the train stream is built to resume there.
  """
  latest = tf.train.latest_checkpoint(_folder(workdir))
  return int(latest.rsplit("-", 1)[1]) if latest else 0


def _folder(workdir: str) -> str:
  return os.path.join(workdir, run_files.CHECKPOINTS)


class Checkpoints:
  """Saves and restores a run's state: every model variable, every variable
  of the optimizers it trains with, and the loop's own step count.

  All model variables are saved, not only the weights: non-trainable state
  (BatchNorm statistics) and each dropout or noise layer's seed-generator
  state too, so a resumed run draws the masks the whole run would have.
  `tf.train.Checkpoint(model=...)` under a strategy saved neither (measured).
  The step is the loop's (the batches read), not an optimizer's: with
  gradient accumulation or a skipped loss-scaled step the optimizer counts
  differently. `stopped` marks a run a callback stopped (model.stop_training):
  a rerun finishes it instead of training on.
  """

  def __init__(self, workdir: str, model, optimizers, chief: bool,
               max_to_keep: int):
    self.workdir, self.folder = workdir, _folder(workdir)
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.stopped = tf.Variable(False, trainable=False)
    self.checkpoint = tf.train.Checkpoint(
        model_variables=list(model.variables),
        optimizer_variables=[v for o in optimizers for v in o.variables],
        step=self.step, stopped=self.stopped)
    self._scratch = None if chief else tempfile.mkdtemp(
        prefix="dist_keras_worker_")
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._scratch or self.folder,
        max_to_keep=1 if self._scratch else max_to_keep)
    self.saved_at = None  # The step of the last save of this run.

  def restore(self, expected_step: int) -> str | None:
    """Restores the latest checkpoint, if any; returns a line saying so.

    Every worker reads the CHIEF's folder, so a multi-worker resume needs a
    workdir all workers see (shared disk or gs://).
    """
    latest = tf.train.latest_checkpoint(self.folder)
    if not latest:
      return None
    try:
      self.checkpoint.restore(latest).assert_consumed()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      raise UserError(
          f"--workdir={self.workdir} holds a checkpoint ({latest}) made by a "
          "different model or optimizer; resume it with the config.json "
          "saved there, or pass a new --workdir.") from e
    step = int(self.step.numpy())
    if step != expected_step:
      raise UserError(f"checkpoint {latest} holds step {step}, not "
                      f"{expected_step}; it was renamed: pass a new --workdir.")
    self.saved_at = step
    if bool(self.stopped.numpy()):
      return (f"resumed from {latest} at step {step}, where a callback "
              "stopped the run (model.stop_training): nothing left to train")
    return f"resumed from {latest} at step {step}"

  def save(self, step: int, stopped: bool = False) -> str:
    self.step.assign(step)
    self.stopped.assign(stopped)
    self.saved_at = step
    return self.manager.save(checkpoint_number=step)

  @property
  def scratch(self) -> str | None:
    """A non-chief worker's private folder (deleted by close), else None."""
    return self._scratch

  def latest(self) -> str | None:
    """The newest checkpoint in the workdir (the chief's), if any."""
    return tf.train.latest_checkpoint(self.folder)

  def go_back(self) -> str:
    """Restores the newest checkpoint into the running model and optimizer
    (after a divergence); returns its path."""
    latest = self.latest()
    self.checkpoint.restore(latest).assert_consumed()
    return latest

  def close(self) -> None:
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)


def check_workers_agree(strategy, step: int, workers: int,
                        workdir: str) -> None:
  """Refuses a resume some workers cannot see (they would diverge)."""
  if workers <= 1:
    return
  total = int(allreduce.host_value_sum(strategy)(step))
  if total != step * strategy.num_replicas_in_sync:
    raise UserError(
        f"this worker is at step {step} after restoring --workdir={workdir}, "
        f"but the workers disagree (sum of steps {total}); put the workdir "
        "on storage every worker sees (shared disk or gs://).")
