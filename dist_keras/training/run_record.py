"""What each checkpoint keeps beside the variables: the last log window's
train values and the run's measurements (summary.json's fields that a
rerun finishing the run without training cannot measure), the totals a
resumed run goes on from (segments.py), the users' callbacks' state
(callback_state.py), and the epoch's train metrics (metrics.py: a run
resumed mid-epoch goes on with them, as a divergence's go-back does).

A run stopped after its last checkpoint and before its results were
written (SIGKILL, a second Ctrl-C, a lost node) is finished by its rerun,
which trains nothing: without this record its summary.json lacked the train
values and every measurement. The record is inside the checkpoint (a
tf.train PythonState), so it is always the one of the checkpoint restored,
saved by every worker as the variables are (only the chief's lands in the
workdir), and deleted with its checkpoint.
"""
import io
import json

import keras
import numpy as np
import tensorflow as tf

from dist_keras.measure import calibration
from dist_keras.training import callback_state, report, segments

_JSON = "record.json"  # The npz member that holds the JSON part.
# summary.json fields a rerun counts itself where the checkpoint keeps no
# measurements (no MFU then); beside a kept MFU they are the record's, the
# count that MFU is of (a rerun's own count differs where the batches'
# shape did: data.seq_len; or where dist_keras counts a layer anew).
_ANALYTIC = ("flops_per_example", "flops_uncounted")


class RunRecord(tf.train.experimental.PythonState):
  """The record saved with a checkpoint: JSON and named arrays, in npz."""

  def __init__(self):
    self.snapshot = None  # () -> (dict, {name: array}): set by Keep.
    # (dict, {name: array}) of the checkpoint restored; None: none, or one
    # saved by a dist_keras that kept no record.
    self.restored = None

  def serialize(self):
    record, arrays = self.snapshot() if self.snapshot else ({}, {})
    text = json.dumps(record, default=lambda o: np.asarray(o).tolist())
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{_JSON: np.asarray(text)})
    return buffer.getvalue()

  def deserialize(self, string_value):
    with np.load(io.BytesIO(string_value), allow_pickle=False) as saved:
      arrays = {name: saved[name] for name in saved.files}
    self.restored = (json.loads(str(arrays.pop(_JSON))), arrays)


class Keep(keras.callbacks.Callback):
  """After the users' on_train_begin: their kept state set again (and the
  line saying what was not), the record's snapshot wired to this run; for
  a rerun that trains, the run's totals so far carried on (segments.py)
  and the epoch's metrics handed to the loop's (metrics.py); for one that
  resumes where training ended, the train values of the checkpoint's last
  log window."""

  def __init__(self, run, trainer, users: list):
    super().__init__()
    self.run, self.trainer, self.users = run, trainer, users
    fields = report.run_fields(trainer, run)
    self.setup = {key: fields[key] for key in segments.SETUP}

  def on_train_begin(self, logs=None):
    run, record = self.run, self.trainer.parts.checkpoints.record
    record.snapshot = self._snapshot
    record_dict, arrays = record.restored or ({}, {})
    lines = []
    if run.resumed_at and self.users:
      lines.append(callback_state.restore(
          self.users, record_dict.get("callbacks"), arrays))
    if run.resumed_at and not run.finishing:
      lines.append(segments.carry_on(run, self.trainer.meters, self.setup,
                                     record_dict, arrays))
      schedule, step = run.schedule, run.resumed_at
      lines.append(self.trainer.train_metrics.resume(
          record_dict.get("metrics"), arrays, step,
          schedule.epoch_after(step) * schedule.epoch_steps))
    if run.finishing and record_dict.get("logged_at") == run.step:
      run.logged, run.logged_at = record_dict["train"], run.step
    for line in lines:
      if line:
        self.trainer.say(line)

  def _snapshot(self):
    run, meters, arrays = self.run, self.trainer.meters, {}
    return {"step": run.step, "logged_at": run.logged_at,
            "train": {k: np.asarray(v).tolist()
                      for k, v in run.logged.items()},
            # What the run chose too: a rerun that trains nothing chose
            # nothing it reports.
            "measured": {**report.measured_fields(run, meters),
                         "chosen": report.chosen(self.trainer)},
            "totals": segments.kept(run, meters, self.setup, arrays),
            "callbacks": callback_state.states(self.users, arrays),
            "metrics": self.trainer.train_metrics.kept(run.step, arrays),
            "stream": _stream(self.trainer.parts.role)}, arrays


def _stream(role) -> dict:
  """What cuts the data into each step's batches, besides the data and
  the global batch: the input pipelines (each reads its shard) and the
  replicas (each takes global / replicas examples of its pipeline's)."""
  return {"input_pipelines": role.pipelines,
          "replicas": role.strategy.num_replicas_in_sync}


def _said(stream: dict) -> str:
  return (f"{stream['replicas']} replica(s) fed by "
          f"{stream['input_pipelines']} input pipeline(s)")


def other_batches(record: RunRecord, role) -> str | None:
  """The resume line's clause for a checkpoint saved with other input
  pipelines or replicas (another number of workers or devices): training
  goes on, but not with the batches the run would have read."""
  before = (record.restored or ({}, {}))[0].get("stream")
  now = _stream(role)
  if before is None or before == now:
    return None
  return (f"on {_said(now)}, where the run had {_said(before)}: the batches "
          "from here differ from an uninterrupted run's (each pipeline's "
          "shard of the data and per-replica batch change), so it is no "
          "longer an exact resume")


def complete(summary: dict, trainer, run) -> str:
  """A rerun that trained nothing (it resumed where training had ended):
  `summary` completed from the checkpoint's record (its measurements;
  its train values are run.logged already, from Keep), what cannot be
  known set to None and named in summary["finished_by_rerun"]; returns
  the line that says so."""
  record = (trainer.parts.checkpoints.record.restored or ({}, {}))[0]
  unknown = []  # (the fields, why they are not known)
  measured = [*report.measured_fields(run, trainer.meters), "chosen"]
  if record.get("step") == run.step:
    kept = record["measured"]
    summary.update(kept)
    # A field the dist_keras that saved it did not keep yet (peak_timed
    # before 2026-12-06, chosen): null, not this process's figure beside
    # the checkpoint's (its timed peak beside the peak the MFU was over).
    missing = [k for k in measured if k not in kept]
    summary.update(dict.fromkeys(missing))
    if missing:
      unknown.append((missing, "its checkpoint was saved by a dist_keras "
                      "that did not keep them"))
  else:
    measured = [k for k in measured if k not in _ANALYTIC]
    summary.update(dict.fromkeys(measured))
    unknown.append((measured, "its checkpoint keeps no measurements"))
  names = [] if run.logged else [
      f"train_{name}"
      for name in record.get("train") or _metric_names(trainer)]
  if names:
    summary.update(dict.fromkeys(names))
    unknown.append((names, "its last steps were not logged"))
  if (trainer.settings.calibration_steps and not trainer.custom_step
      and summary.get("examples_per_sec")):
    missing = calibration.not_measured(trainer.replicas)
    summary.update(missing)
    unknown.append((sorted(k for k, v in missing.items() if v is None),
                    "the calibration runs after the last checkpoint"))
  summary["finished_by_rerun"] = {
      "checkpoint": f"ckpt-{run.step}",
      "not_known": [key for keys, _ in unknown for key in keys]}
  said = "; ".join(f"{', '.join(keys)} ({why})" for keys, why in unknown)
  again = "its eval is run again; " if trainer.parts.evaluates else ""
  return (f"results written by this rerun for ckpt-{run.step} (the run "
          f"that trained it stopped before writing them): {again}its train "
          "values and measurements are those kept with the checkpoint" + (
              f"; not known (null in summary.json): {said}" if said else ""))


def _metric_names(trainer) -> list:
  """The train values' names (loss, metrics), from no state at all."""
  state = trainer.metric_state
  return list(state.results([np.zeros(v.shape, v.dtype)
                             for v in state.variables]))
