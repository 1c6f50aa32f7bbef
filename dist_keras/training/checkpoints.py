"""The run's checkpoints: every model and optimizer variable, numbered by
step, in workdir/checkpoints.

Every worker takes part in a save (TF's multi-worker pattern), but only the
chief's lands in the workdir; the others write to a private temporary
folder, deleted by close(). Keras' BackupAndRestore is not worker-aware.
"""
import dataclasses
import functools
import os
import re
import shutil
import time

import tensorflow as tf

from dist_keras import errors, validate
from dist_keras.distribute import leaving, strategies
from dist_keras.errors import UserError
from dist_keras.training import allreduce, checkpoint_files, keras_internals
from dist_keras.training import rnn_states, run_config, run_files, run_record


def _folder(workdir: str) -> str:
  return os.path.join(workdir, run_files.CHECKPOINTS)


# ckpt-STEP.index, ckpt-STEP.data-00000-of-00001 (not ckpt-STEP_temp/).
_NUMBERED = re.compile(r"ckpt-(\d+)\.")
_STATE_FILE = checkpoint_files.LIST_FILE  # TF's list of the checkpoints.


@dataclasses.dataclass(frozen=True)
class Resume:
  """Where a run resumes: the newest intact checkpoint (None: none saved),
  its step (0: from the start), the newer ones found damaged, and the steps
  of newer ones whose save was cut short (checkpoint_files.cut_short)."""

  path: str | None
  step: int
  damaged: tuple[str, ...] = ()
  cut_short: tuple[int, ...] = ()

  def line(self) -> str | None:
    """'ckpt-30 is damaged (why): resuming from ckpt-20', if any was."""
    if not self.damaged:
      return None
    return (f"{'; '.join(self.damaged)}: resuming from "
            f"{os.path.basename(self.path)}")


def find_resume(workdir: str) -> Resume:
  """The newest checkpoint in `workdir` whose every tensor reads back.

  Checkpoints are numbered by step (ckpt-STEP), so the step is known before
  the model exists: the train stream is built to resume there. A damaged
  one (truncated, overwritten, a file missing: a node lost mid-copy, a full
  disk) is passed over for the one before; every worker reads the same
  files, so all resume from the same one. Reading every tensor is what
  catches a damaged data file: TF checks each tensor's checksum as it reads.
  One whose save was killed mid-way is no damage: it is passed over too,
  and the chief removes it (restored), even when it was the only one.

  Raises:
    NoIntactCheckpoint: checkpoints are there but none reads back.
  """
  folder, damaged, cut = _folder(workdir), [], []
  listed = checkpoint_files.listed(folder)
  steps = None if listed is None else {step for step, _ in listed[0]}
  for step in _steps_saved(folder):
    path = os.path.join(folder, f"ckpt-{step}")
    problem = _damage(path)
    if problem is None:
      return Resume(path, step, tuple(damaged), tuple(cut))
    if checkpoint_files.cut_short(folder, step, steps):
      cut.append(step)
    else:
      damaged.append(f"ckpt-{step} is damaged ({problem})")
  if damaged:
    raise errors.NoIntactCheckpoint(
        f"{validate.named_workdir(workdir)}: no checkpoint reads back: "
        f"{'; '.join(damaged)}; retrying may find a copy still arriving, "
        "else restore checkpoints/ from a backup or pass a new "
        f"{validate.workdir_option()}.")
  return Resume(None, 0, cut_short=tuple(cut))


def _steps_saved(folder: str) -> list[int]:
  """The steps of the checkpoints in `folder`, newest first: those whose
  files are there and those the state file lists (a damaged or lost state
  file must not hide them, nor a listed one with a file missing)."""
  steps = set()
  for path in tf.io.gfile.glob(os.path.join(folder, "ckpt-*")):
    found = _NUMBERED.match(os.path.basename(path))
    if found:
      steps.add(int(found.group(1)))
  state, _ = checkpoint_files.read_list(folder)
  for path in state.all_model_checkpoint_paths if state else ():
    found = _NUMBERED.match(os.path.basename(path) + ".")
    if found:
      steps.add(int(found.group(1)))
  return sorted(steps, reverse=True)


def _repair_state(folder: str, resume: Resume) -> str | None:
  """Rewrites an unreadable state file from the checkpoint files up to the
  one resumed (CheckpointManager would fail on it, or forget them and never
  delete the old ones); returns the line that says so."""
  if not checkpoint_files.read_list(folder)[1]:
    return None
  kept = ([step for step in sorted(_steps_saved(folder))
           if step <= resume.step] if resume.path else [])
  now = time.time()  # CheckpointManager deletes only those with a time.
  checkpoint_files.write_list(folder, [(step, now) for step in kept])
  return (f"{run_files.CHECKPOINTS}/{_STATE_FILE} (TensorFlow's list of the "
          "checkpoints) was unreadable: rewritten from the checkpoint files")


def _damage(path: str) -> str | None:
  """Why the checkpoint at `path` does not read back, or None."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except (tf.errors.OpError, IndexError, ValueError) as e:
    # IndexError: TF's reader of a truncated data file raises it.
    # The folder is in the one line already: say only the file's name.
    folder = os.path.dirname(path) + os.sep
    return errors.first_line(e, limit=400).replace(folder, "")[:160]
  return None


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
  a rerun finishes it instead of training on. `record` (run_record.py): the
  last log window's train values, the measurements, the users' callbacks'
  state and the epoch's metric state, for the rerun.
  """

  def __init__(self, workdir: str, model, optimizers, chief: bool,
               max_to_keep: int):
    self.workdir, self.folder = workdir, _folder(workdir)
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.stopped = tf.Variable(False, trainable=False)
    self._variables = dict(
        model_variables=list(model.variables),
        optimizer_variables=[v for o in optimizers.values()
                             for v in o.variables],
        step=self.step, stopped=self.stopped)
    self.record = run_record.RunRecord()  # Train values, measurements.
    self.rnn = rnn_states.States(model)  # Not in model.variables.
    self.checkpoint = tf.train.Checkpoint(
        **self._variables, **self.rnn.parts(), record=self.record)
    self._scratch, self._scratch_lock = (
        (None, None) if chief else checkpoint_files.make_scratch())
    self._max_to_keep = 1 if self._scratch else max_to_keep
    self.saved_at = None  # The step of the last save of this run.

  @functools.cached_property
  def manager(self) -> tf.train.CheckpointManager:
    # Made at the first save: it reads TF's list once, as it is made, and
    # restored() may add to the list once the restore has succeeded.
    return tf.train.CheckpointManager(
        self.checkpoint, self._scratch or self.folder,
        max_to_keep=self._max_to_keep)

  def restore(self, resume: Resume) -> str | None:
    """Restores the checkpoint `resume` names, if any; returns the line
    that says so (and which newer ones were damaged).

    Every worker reads the CHIEF's folder, so a multi-worker resume needs a
    workdir all workers see (shared disk or gs://).
    """
    if resume.path is None:
      return None
    name = os.path.basename(resume.path)
    try:
      zeroed = self._restore(resume.path)
    except (AssertionError, ValueError, tf.errors.OpError) as e:
      # Its tensors read back (find_resume): they are another model's.
      raise UserError(
          f"{validate.named_workdir(self.workdir)} holds a checkpoint "
          f"({name}) made by a "
          "different model or optimizer (its variables' names or shapes "
          "differ); resume it with the code and config that made it "
          "(config.json there names them), or pass a new "
          f"{validate.workdir_option()}.") from e
    step = int(self.step.numpy())
    if step != resume.step:
      raise UserError(f"checkpoint {resume.path} holds step {step}, not "
                      f"{resume.step}; it was renamed: pass a new "
                      f"{validate.workdir_option()}.")
    self.saved_at = step
    said = f"{resume.line() or f'resumed from {name}'} at step {step}"
    said += f"; {zeroed}" if zeroed else ""
    if bool(self.stopped.numpy()):
      said += (", where a callback stopped the run (model.stop_training): "
               "nothing left to train")
    return said

  def save(self, step: int, stopped: bool = False) -> str:
    self.step.assign(step)
    self.stopped.assign(stopped)
    self.rnn.gather()  # (Every worker: a collective.)
    path = self.manager.save(checkpoint_number=step)
    self.saved_at = step  # (Not a save that failed.)
    if self._scratch is None:
      run_files.check_held(self.workdir, os.path.basename(path))
      run_config.saved(self.workdir)  # A resumed run's config.json.
    return path

  @property
  def scratch(self) -> str | None:
    """A non-chief worker's private folder (deleted by close), else None."""
    return self._scratch

  def last_saved(self) -> str:
    """The checkpoint this run last saved or resumed from, in the workdir
    (not the folder's newest: that one may be damaged)."""
    return os.path.join(self.folder, f"ckpt-{self.saved_at}")

  def go_back(self) -> str:
    """Restores the last checkpoint this run saved or resumed from into the
    running model and optimizer (after a divergence); returns its path."""
    path = self.last_saved()
    self._restore(path)
    return path

  def _restore(self, path: str) -> str | None:
    """Every variable of the checkpoint at `path`, its record and RNN
    states if it has them (one saved before they were kept restores
    without); returns the line saying the states start at zero, if so."""
    saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    rnn, record = self.rnn.parts(saved), {"record": self.record}
    if not any(key.startswith("record/") for key in saved):
      record = {}
    self.record.restored = None
    into = (self.checkpoint if record and rnn is self.rnn.parts() else
            tf.train.Checkpoint(**self._variables, **rnn, **record))
    try:
      into.restore(path).assert_consumed()
    except (AssertionError, ValueError, tf.errors.OpError):
      keras_internals.restore_abandoned(into)
      raise
    return self.rnn.put_back(saved, os.path.basename(path))

  def close(self) -> None:
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)
      os.close(self._scratch_lock)
      self._scratch = None


def restored(workdir: str, model, optimizers, role: strategies.Role,
             max_to_keep: int, resume: Resume):
  """(the run's Checkpoints, its "resumed from ..." line or None): the
  checkpoint `resume` names restored, every worker agreeing on it; then the
  chief tidies what saves cut short left (checkpoint_files.tidy), said in
  the same line."""
  folder = _folder(workdir)
  repaired = _repair_state(folder, resume) if role.chief else None
  saved = Checkpoints(workdir, model, optimizers, role.chief, max_to_keep)
  try:
    lines = [repaired, saved.restore(resume),
             run_record.other_batches(saved.record, role)]
    check_workers_agree(role.strategy, resume.step, role.workers, workdir)
    # After the agreement, a collective every worker reaches only once it
    # has found and restored its checkpoint: no worker still reads what
    # the chief removes.
    if role.chief:
      lines[1:1] = checkpoint_files.tidy(
          folder, resume.step if resume.path else None, resume.cut_short)
  except BaseException:  # (A stop request before training, too.)
    saved.close()
    raise
  return saved, "; ".join(filter(None, lines)) or None


def check_workers_agree(strategy, step: int, workers: int,
                        workdir: str) -> None:
  """Refuses a resume some workers cannot see (they would diverge)."""
  if workers <= 1:
    return
  total = int(allreduce.host_value_sum(strategy)(step))
  if total != step * strategy.num_replicas_in_sync:
    # Every worker sees the same sum.
    raise leaving.refused_together(UserError(
        f"this worker is at step {step} after restoring "
        f"{validate.named_workdir(workdir)}, "
        f"but the workers disagree (sum of steps {total}); put the workdir "
        "on storage every worker sees (shared disk or gs://)."))
