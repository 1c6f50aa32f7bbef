"""What a run reports: its progress lines, the values TensorBoard gets at a
logged step, and summary.json."""
import numpy as np

from dist_keras.measure import breakdown as breakdown_lib
from dist_keras.measure import timing


def metrics_text(values: dict) -> str:
  """'loss 0.1234  accuracy 0.9120': the loss first, then each metric."""
  ordered = {"loss": values["loss"], **values}
  return "  ".join(f"{name} {value:.4f}" if abs(value) < 1e4
                   else f"{name} {value:.4g}"
                   for name, value in ordered.items())


def perplexity(loss: float) -> float:
  """exp(mean per-token cross-entropy), capped where exp overflows."""
  return float(np.exp(min(loss, 50.0)))


def progress_line(step: int, steps: int, values: dict, rate, remaining_s):
  """'step  25/800  loss 1.3864  accuracy 0.2436  9,512 ex/s  ETA 0:00:25'."""
  return (f"step {step:>{len(str(steps))}}/{steps}  {metrics_text(values)}  "
          + (f"{rate:,.0f} ex/s  " if rate else "(warm-up)  ")
          + f"ETA {timing.eta(remaining_s)}")


def eval_line(step: int, result: dict) -> str:
  metrics = {k: v for k, v in result.items() if k != "examples"}
  return (f"eval at step {step}: {metrics_text(metrics)}  "
          f"({result['examples']} examples)")


def done_line(summary: dict) -> str:
  """'done: 800 steps, eval accuracy 1.0000, loss 0.0012'."""
  metrics = [(k[len("eval_"):], v) for k, v in summary.items()
             if k.startswith("eval_") and k not in ("eval_loss",
                                                    "eval_examples")]
  text = ", ".join(f"{name} {value:.4f}" for name, value in
                   [*metrics, ("loss", summary["eval_loss"])])
  return f"done: {summary['steps']} steps, eval {text}"


def summary(*, run: dict, last: dict, final_eval: dict, throughput,
            sync_log, calibrated: dict, utilisation, gradient_bytes: int,
            skipped_steps: int) -> dict:
  """summary.json: `run` (strategy, replicas, steps, ...), the last logged
  train values and the final eval as train_NAME / eval_NAME, throughput,
  the sync breakdown's means, the calibration, MFU."""
  means = sync_log.means()
  eps = throughput.examples_per_sec
  replicas = run["replicas"]
  return {
      **run,
      **{f"train_{name}": value for name, value in last.items()},
      **{f"eval_{name}": value for name, value in final_eval.items()},
      "examples_per_sec": eps,
      "examples_per_sec_per_replica": eps / replicas if eps else None,
      # Wall ms per step over the log windows (the warm-up one left out).
      **timing.step_time_stats(throughput.window_ms),
      "gradient_bytes": gradient_bytes,
      # Means over the instrumented steps (None with log.sync_timing off).
      "sync_fraction": means.get("fraction"),
      **{k: means.get(k) for k in (*breakdown_lib.SyncLog.COMPONENTS,
                                   "step_ms")},
      "skipped_steps": skipped_steps,
      "ideal_step_ms": None, "ideal_speedup": None,
      **calibrated,
      **utilisation.summary(eps),
  }
