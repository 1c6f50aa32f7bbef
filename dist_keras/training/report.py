"""What a run reports: its header and last lines, progress and eval lines,
and summary.json (summary_json)."""
import os
import shlex
import shutil
import sys

import numpy as np
import tensorflow as tf

from dist_keras.distribute import strategies
from dist_keras.measure import breakdown, mfu, timing
from dist_keras.training import run_files, steps


def metrics_text(values: dict) -> str:
  """'loss 0.1234  accuracy 0.9120': the loss first (if any), then each
  metric."""
  ordered = {**({"loss": values["loss"]} if "loss" in values else {}),
             **values}
  return "  ".join(f"{name} {number_text(value)}"
                   for name, value in ordered.items())


def number_text(value, shown: int = 6) -> str:
  """'0.1234', '1.235e+04'; an array's (a metric of a value per class)
  first `shown` values in brackets: '[0.0570 0.2090 0.1150 0.6040]'."""
  if np.ndim(value):
    flat = np.ravel(value)
    more = f" ...{flat.size} values" if flat.size > shown else ""
    return f"[{' '.join(number_text(v) for v in flat[:shown])}{more}]"
  return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"


def perplexity(loss: float) -> float:
  """exp(mean per-token cross-entropy), capped where exp overflows."""
  return float(np.exp(min(loss, 50.0)))


def progress_line(step: int, steps: int, values: dict, rate, remaining_s):
  """'step  25/800  loss 1.3864  accuracy 0.2436  9,512 ex/s  ETA 0:00:25'."""
  return (f"step {step:>{len(str(steps))}}/{steps}  {metrics_text(values)}  "
          + (f"{rate:,.0f} ex/s  " if rate else "(warm-up)  ")
          + f"ETA {timing.eta(remaining_s)}")


# The step functions a run traces (calls.Calls): name, which steps run it.
FUNCTIONS = {"one": ("step function", "every step runs it"),
             "timed": ("timed step function", "logged steps run it"),
             "plain": ("plain step function", "the untimed steps run it")}


def traced_line(first: int, last: int, seconds: float, function: str) -> str:
  """'step 1 in 41.3 s: traced and compiled the timed step function ...'."""
  steps = f"step {first}" if first == last else f"steps {first}-{last}"
  return (f"{steps} in {seconds:.1f} s: traced and compiled the "
          "{} ({})".format(*FUNCTIONS[function]))


def heartbeat_line(step: int, steps: int, seconds_per_step) -> str:
  """'step  7/30  12.40 s/step  ETA 0:04:49', between log lines."""
  if seconds_per_step is None:
    rate, left = "", None
  else:
    rate = (f"{seconds_per_step:.2f} s/step  " if seconds_per_step >= 1
            else f"{1e3 * seconds_per_step:.0f} ms/step  ")
    left = (steps - step) * seconds_per_step
  return (f"step {step:>{len(str(steps))}}/{steps}  {rate}"
          f"ETA {timing.eta(left)}")


def eval_line(step: int, result: dict, seconds: float, traced: bool) -> str:
  """'eval at step 100: loss 1.3064  accuracy 0.3525  (2048 examples in
  0.4 s)'; the pass that traced and compiled the eval function says so."""
  metrics = {k: v for k, v in result.items() if k != "examples"}
  compiled = ": traced and compiled the eval pass" if traced else ""
  n = result["examples"]
  return (f"eval at step {step}: {metrics_text(metrics)}  "
          f"({n} example{'' if n == 1 else 's'} in {seconds:.1f} s"
          f"{compiled})")


def done_line(summary: dict) -> str:
  """'done: 800 steps, eval accuracy 1.0000, loss 0.0012' (and where a
  callback stopped training)."""
  metrics = [(k[len("eval_"):], v) for k, v in summary.items()
             if k.startswith("eval_") and k not in ("eval_loss",
                                                    "eval_examples")]
  if "eval_loss" in summary:
    metrics.append(("loss", summary["eval_loss"]))
  text = ", ".join(f"{name} {number_text(value)}" for name, value in metrics)
  stopped = " (stopped by a callback)" if summary.get("stopped_early") else ""
  steps = summary["steps"]
  return f"done: {steps} step{'' if steps == 1 else 's'}{stopped}" + (
      f", eval {text}" if text else "")


def header(strategy, workdir: str, tensorboard: bool) -> str:
  """The run's first lines: where it trains, where it writes."""
  return (f"dist_keras: {strategies.display_name(strategy)} with "
          f"{strategy.num_replicas_in_sync} replica(s) on "
          f"{mfu.device_kind(strategy)}; workdir {workdir}"
          + tensorboard_line(workdir, tensorboard))


def footer(summary: dict, workdir: str, tensorboard: bool) -> str:
  """The run's last lines: how it ended, where the results are."""
  return (f"{done_line(summary)}; results in "
          f"{os.path.join(workdir, run_files.SUMMARY_JSON)}"
          + tensorboard_line(workdir, tensorboard))


def tensorboard_line(workdir: str, writing: bool) -> str:
  """'\\nTensorBoard: tensorboard --logdir W', a command to paste (W quoted
  for a shell; the script's path where PATH lacks it; how to install it
  where there is none), when this run writes events or an earlier one did;
  else ''."""
  try:
    shown = writing or tf.io.gfile.glob(
        os.path.join(workdir, "events.out.tfevents.*"))
  except tf.errors.OpError:  # (A worker that cannot see the chief's.)
    shown = False
  if not shown:
    return ""
  command = tensorboard_command()
  logdir = f"--logdir {shlex.quote(workdir)}"
  if command is None:
    python = shlex.quote(sys.executable)
    return (f"\nTensorBoard: not installed for this Python; {python} -m pip "
            f"install tensorboard, then {python} -m tensorboard.main {logdir}")
  return f"\nTensorBoard: {command} {logdir}"


def tensorboard_command() -> str | None:
  """How the user's shell starts TensorBoard: `tensorboard` where PATH finds
  it; the script beside this Python where PATH lacks it (a venv run as
  .venv/bin/python, never activated, as the README's quick start does), or
  finds only that one with no venv activated (the launcher's workers: it put
  that folder first on their PATH, not on the user's); else None."""
  found = shutil.which("tensorboard")
  beside = shutil.which("tensorboard",
                        path=os.path.dirname(sys.executable) or None)
  if found and (not beside or os.environ.get("VIRTUAL_ENV")
                or os.path.realpath(found) != os.path.realpath(beside)):
    return "tensorboard"
  return shlex.quote(beside) if beside else None


def throughput_line(meters) -> str:
  """The throughput line; a resumed run's says over which segments."""
  line = timing.throughput_line(
      meters.throughput.examples_per_sec,
      timing.step_time_stats(meters.throughput.window_ms))
  covers = meters.segments
  if not covers:
    return line
  since = covers["rates_from_step"]
  return line + (f" after step {since}" if since else
                 f" over the run's {covers['segments']} segments")


def summary_json(run_fields: dict, run, meters) -> dict:
  """summary.json: `run_fields` (strategy, replicas, steps, ...), the last
  logged train values and the final eval as train_NAME / eval_NAME,
  throughput, the sync breakdown's means, the calibration, MFU."""
  return {
      **run_fields,
      # A metric of a value per class as a list (JSON has no arrays).
      **{f"train_{name}": np.asarray(value).tolist()
         for name, value in run.logged.items()},
      **{f"eval_{name}": np.asarray(value).tolist()
         for name, value in run.final_eval.items()},
      **measured_fields(run, meters),
      "call_step_ms": None, "ideal_step_ms": None, "ideal_speedup": None,
      **run.calibrated,
  }


def measured_fields(run, meters) -> dict:
  """summary.json's fields that the training measured (throughput, the
  sync breakdown's means, MFU, tracing, skipped steps): what a checkpoint
  keeps for a rerun that finishes the run without training
  (run_record.py). A resumed run's are over the segments that
  "resumed" names (segments.py)."""
  means = meters.sync_log.means()
  eps = meters.throughput.examples_per_sec
  split = ("model_step" if "model_step_ms" in means
           else "compute, straggler, allreduce")
  return {
      "examples_per_sec": eps,
      "examples_per_sec_per_replica": eps / meters.replicas if eps else None,
      # Wall ms per step over the log windows (the warm-up one left out).
      **timing.step_time_stats(meters.throughput.window_ms),
      "gradient_bytes": meters.traffic.allreduced,
      "gathered_bytes": meters.traffic.gathered,
      # Means over the instrumented steps (None with log.sync_timing off,
      # but outside_ms and callbacks_ms: host clocks, every log window).
      # A model's own train_step splits into input wait and model_step only.
      "sync_split": split if meters.sync_log.count else None,
      "sync_fraction": means.get("fraction"),
      **{k: means.get(k) for k in (*breakdown.SyncLog.COMPONENTS,
                                   "model_step_ms", "step_ms", "outside_ms",
                                   "callbacks_ms")},
      # Wall seconds the throughput leaves out: evals, checkpoints.
      "paused_s": meters.paused_seconds,
      "skipped_steps": run.skipped_steps,
      "skipped_after_divergence": run.skipped,
      # Wall seconds of the calls that traced and compiled a function.
      "tracing_calls_s": run.tracing_seconds,
      **meters.utilisation.summary(eps),
      **({"resumed": meters.segments} if meters.segments else {}),
  }


def run_fields(trainer, run) -> dict:
  """summary.json's fields that say what ran: strategy, replicas, steps,
  batch, precision, rates, the step function, callbacks, how it ended,
  the file the model is saved in."""
  strategy = trainer.strategy
  return {"strategy": strategies.display_name(strategy),
          "device_kind": mfu.device_kind(strategy),
          "replicas": trainer.replicas, "steps": run.step,
          "global_batch_size": trainer.settings.global_batch_size,
          "dtype_policy": trainer.model.dtype_policy.name,
          "base_learning_rate": trainer.parts.rate.base,
          "peak_learning_rate": trainer.parts.rate.peak,
          "train_step": "model" if trainer.custom_step else "dist_keras",
          "callbacks": [type(c).__name__ for c in trainer.parts.callbacks],
          "stopped_early": run.stopping,
          "model_file": trainer.parts.model_file,
          "chosen": chosen(trainer)}


def chosen(trainer) -> dict:
  """summary.json's "chosen": what dist_keras chose for the run that
  config.json (the config as asked) does not say; the strategy and the
  replicas are the run's fields beside it."""
  schedule, calls = trainer.settings.schedule, trainer.meters.calls.by_size
  return {
      # train.steps_per_loop as the run took it (the model's
      # steps_per_execution, 1 for a callback's batch hooks), or "auto".
      "steps_per_call": schedule.steps_per_loop or "auto",
      # This process's largest call (calls that traced a function aside).
      "largest_call": max(calls) if calls else None,
      "xla": xla_compiled(trainer),
      "per_replica_batch": (trainer.settings.global_batch_size
                            // trainer.replicas)}


def xla_compiled(trainer) -> str:
  """What XLA compiled of the step: "off"; "replica_step" (a TPU's, or
  one device's untimed steps under train.jit_compile: the update too);
  "forward_backward" (the all-reduce and update in the graph: several
  devices, and one device's timed steps); "train_step" (a model's own,
  under jit)."""
  strategy = trainer.strategy
  jit = steps.Jit.of(trainer.settings.step_options["jit_compile"])
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return "replica_step"
  if jit is steps.Jit.OFF:
    return "off"
  if trainer.custom_step:
    return "train_step"
  return ("replica_step" if steps.compiles_whole(strategy, jit)
          else "forward_backward")
