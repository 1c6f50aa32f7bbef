"""How a run ends with the model it saves: the weights training ends with
(a callback may restore others, as EarlyStopping(restore_best_weights=True)
does), its results (summary.json, model.keras, or model.weights.h5 for a
model Keras cannot save whole: run_files.model_file), and a rerun of a
workdir whose training has ended; and a measured peak's second reading
(TimePeakAgain), where training ends.

summary.json's eval is of the model saved there, and a rerun
of a finished workdir keeps what its run wrote (the checkpoint holds the
last step's weights, which may not be the ones saved; a callback's files,
as a CSVLogger's, would be rewritten by a run of no epochs).
"""
import hashlib
import os
import zipfile

import h5py
import keras
import tensorflow as tf

from dist_keras import validate
from dist_keras.training import actions
from dist_keras.training import allreduce, compiled, keras_internals
from dist_keras.training import ray_report, report
from dist_keras.training import run_config, run_files, run_record


class TimePeakAgain(actions.Boundary):
  """Times a measured peak again where training ends (measure/mfu.py),
  paused out of the throughput, before the last checkpoint keeps the
  run's measurements (what a rerun that trains nothing reports). Not when
  a stop request ended training: a preemption's grace is short."""

  def __init__(self, run: actions.RunState, meters, stop_request):
    super().__init__(run)
    self.meters, self.stop_request = meters, stop_request

  def at(self, step: int, epoch_end: bool) -> None:
    if epoch_end and self.run.finishing and not self.stop_request.requested:
      self.meters.pause()
      self.meters.utilisation.time_peak_again(
          self.meters.throughput.examples_per_sec)
      self.meters.resume()


def fingerprint(model) -> str:
  """A digest of every weight of `model` (one variable on the host at a
  time): what a callback's end of training may have changed."""
  digest = hashlib.blake2b(digest_size=16)
  for variable in model.weights:
    digest.update(tf.convert_to_tensor(variable).numpy().tobytes())
  return digest.hexdigest()


def agreed(strategy, workers: int, here: bool) -> bool:
  """`here`, once every worker says so (a choice that runs collectives or
  not must be the same on all of them)."""
  if workers <= 1:
    return here
  return allreduce.every_worker(strategy)(here)


def finished_summary(workdir: str, step: int) -> dict | None:
  """summary.json when the workdir's run wrote it at checkpoint `step` (its
  training over), else None (a run killed after its last checkpoint: the
  rerun writes it)."""
  try:
    summary = run_files.read_json(workdir, run_files.SUMMARY_JSON)
  except (tf.errors.OpError, OSError, ValueError):
    return None
  if not isinstance(summary, dict) or summary.get("steps") != step:
    return None
  return summary


def readable(path: str) -> bool:
  """Whether `path` reads back whole: model.keras a zip file, every
  member's checksum right; model.weights.h5 an HDF5 file, every array
  read."""
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      if not path.endswith(".h5"):
        with zipfile.ZipFile(f) as saved:
          return saved.testzip() is None
      with h5py.File(f, "r") as saved:
        saved.visititems(_read_array)
      return True
  except (tf.errors.OpError, OSError, zipfile.BadZipFile, EOFError,
          ValueError, KeyError, RuntimeError):
    return False


def _read_array(_, item) -> None:
  """Reads an HDF5 dataset whole (visititems stops at a non-None return)."""
  if isinstance(item, h5py.Dataset):
    item[()]  # pylint: disable=pointless-statement


def finished_line(step: int, steps: int, stopped: bool,
                  saved: str = run_files.MODEL_FILE) -> str:
  why = ("a callback stopped it" if stopped else
         f"train.steps={steps} is below it" if step > steps else
         "train.steps reached")
  new = f"pass a new {validate.workdir_option()}"
  more = (f"{new} to train again" if stopped else
          f"raise train.steps to train on, or {new}")
  return (f"this workdir already finished at step {step} ({why}): its "
          f"summary.json and {saved} are kept as that run wrote them "
          f"({more})")


def past_steps_line(step: int | None, steps: int, stopped: bool) -> str:
  """The line for a workdir whose checkpoint is past train.steps, but whose
  results were not written (a run stopped there, rerun with fewer steps):
  nothing is trained, and they are written for the step it is at."""
  if step is None or stopped or step <= steps:
    return ""
  return (f"this workdir is at step {step} (train.steps={steps} is below "
          f"it): nothing is trained; its results are written for step "
          f"{step} (pass a new {validate.workdir_option()} to train {steps} "
          "steps)")


def finalize(trainer, run, hooks, logs) -> None:
  """As fit ends: an EMA optimizer swaps its averages into the model, then
  the callbacks' train end may restore others (EarlyStopping(
  restore_best_weights=True)); the final eval, which summary.json
  reports, is of the model that is saved."""
  model = trainer.model
  # Those its averages are of (zipped with them): fit's trainable_weights
  # unless a callback froze a layer after model_fn (trained_set.py).
  model.optimizer.finalize_variable_values(
      keras_internals.built_on(model.optimizer) or model.trainable_weights)
  why = []
  if compiled.keeps_ema(model.optimizer):
    why.append("the optimizer's averages are now the model's weights")
  before = fingerprint(model) if trainer.parts.callbacks else None
  hooks.on_train_end(logs)
  if before is not None and agreed(
      trainer.strategy, trainer.workers, fingerprint(model) != before):
    why.append("a callback set other weights as training ended")
  if why:
    trainer.say(f"{' and '.join(why)} (as under fit); the model saved is "
                "evaluated again:")
    run.final_eval = trainer.evaluate()


def finish(trainer, run) -> dict:
  """summary.json and the model's file, once the callbacks are done; from
  then on a stop request changes nothing."""
  meters = trainer.meters
  eps = meters.throughput.examples_per_sec
  if eps:
    trainer.say(report.throughput_line(meters))
  summary = report.summary_json(report.run_fields(trainer, run), run, meters)
  if run.resumed_at and run.step == run.resumed_at:
    # Nothing trained: the results of a run stopped after its last
    # checkpoint, from what that checkpoint kept.
    trainer.say(run_record.complete(summary, trainer, run))
  else:
    trainer.say(meters.utilisation.line(eps))
  trainer.tensorboard.flush()
  if trainer.chief:
    run_files.save_model(trainer.workdir, trainer.model,
                         trainer.parts.model_file)
    run_files.write_json(trainer.workdir, run_files.SUMMARY_JSON, summary)
  trainer.stop.ended = True
  return summary


def load_saved(workdir: str, model, name: str = run_files.MODEL_FILE) -> None:
  """The weights of the workdir's model.keras (or model.weights.h5: `name`)
  into `model` (what the rerun returns is what its run saved)."""
  model.load_weights(os.path.join(workdir, name))


def finished_before(trainer) -> dict | None:
  """A rerun of a workdir whose training had ended: nothing is written,
  the model takes the weights saved, and its summary.json is returned;
  None when there is training left or its results were not written."""
  checkpoints = trainer.parts.checkpoints
  steps = trainer.settings.schedule.steps
  step, stopped = checkpoints.saved_at, bool(checkpoints.stopped.numpy())
  if step is None or not (stopped or step >= steps):
    return None
  name = trainer.parts.model_file
  saved = os.path.join(trainer.workdir, name)
  model_reads = readable(saved)  # Missing or damaged: written again.
  kept = finished_summary(trainer.workdir, step) if model_reads else None
  if not agreed(trainer.strategy, trainer.workers, kept is not None):
    if not model_reads and tf.io.gfile.exists(saved):
      trainer.say(f"{name} does not read back (a damaged "
                  "file): this rerun evaluates the last checkpoint and "
                  "writes it again")
    return None
  changed = (run_config.config_changes(
      trainer.workdir, trainer.config_dict, kept=run_config.NOT_APPLIED)
             if trainer.chief else "")
  for note in [*trainer.notes, changed]:
    if note:
      trainer.say(note)
  trainer.say(finished_line(step, steps, stopped, name))
  load_saved(trainer.workdir, trainer.model, name)
  trainer.history = keras.callbacks.History()
  ray_report.report_kept(kept, checkpoints, trainer.chief)
  return kept
