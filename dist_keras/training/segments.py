"""A resumed run's summary.json over its segments: the processes that
trained it, each from the checkpoint the one before saved.

Each checkpoint's record (run_record.py) keeps the run's totals up to its
step: the counts (skipped steps, the batches passed over after a
divergence, the seconds spent tracing) and what the rates are computed
from (the throughput's counted steps and seconds, the log windows' step
times, the sync breakdown's sums). A process that resumes goes on from
them, so its summary.json, its next checkpoints' records and its
TensorBoard train/skipped_steps are the whole run's, as an uninterrupted
run's are. Steps a killed process trained after its last checkpoint are in
no segment (the rerun trains them again, and counts them once).

The rates go on only while what summary.json names of the step (SETUP)
stays the same: after a resume with another batch size or replica count
they start again, and summary.json's "resumed" says from which step.
"""
# summary.json's fields that make one segment's rates comparable with
# another's.
SETUP = ("strategy", "device_kind", "replicas", "global_batch_size",
         "dtype_policy", "train_step")


def kept(run, meters, setup: dict, arrays: dict) -> dict:
  """The record's totals: the run's up to the checkpoint saved now."""
  return {"setup": setup, "segments": meters.segments,
          "skipped_steps": run.skipped_steps, "skipped": run.skipped,
          "tracing_seconds": run.tracing_seconds,
          "rates": meters.kept(arrays)}


def carry_on(run, meters, setup: dict, record: dict, arrays: dict) -> str:
  """At a resume that trains: `run` and `meters` go on from the totals of
  `record` (the checkpoint's), and meters.segments says what they cover;
  returns a line when the rates start again here ('' otherwise)."""
  step, totals = run.resumed_at, record.get("totals")
  if totals is None:  # Saved by a dist_keras that kept no totals.
    meters.segments = _covers([step], counts_from=step, rates_from=step)
    return (f"summary.json's measurements cover the steps after {step} "
            "only: the checkpoint keeps none of the run's before it")
  before = totals["segments"] or _covers([], 0, 0)
  run.skipped_steps += totals["skipped_steps"]
  run.skipped[:0] = totals["skipped"]
  # train.divergence_retries is the run's, not each process's.
  run.retries_left = max(0, run.retries_left - len(totals["skipped"]))
  run.tracing_seconds += totals["tracing_seconds"]
  changed = [f"{key} {totals['setup'].get(key)} -> {setup[key]}"
             for key in SETUP if totals["setup"].get(key) != setup[key]]
  if not changed:
    meters.carry_on(totals["rates"], arrays)
  meters.segments = _covers(
      [*before["resumed_at"], step], before["counts_from_step"],
      step if changed else before["rates_from_step"])
  return (f"summary.json's rates (throughput, step times, the sync "
          f"breakdown, MFU) cover the steps after {step}: "
          f"{', '.join(changed)} at this resume" if changed else "")


def _covers(resumed_at: list, counts_from: int, rates_from: int) -> dict:
  """summary.json's "resumed": the steps processes resumed at, and after
  which step the counts and the rates are summed."""
  return {"segments": len(resumed_at) + 1, "resumed_at": resumed_at,
          "counts_from_step": counts_from, "rates_from_step": rates_from}
