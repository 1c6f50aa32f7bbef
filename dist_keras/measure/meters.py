"""What a run measures while it trains, in one object the loop owns:
wall time per log window and throughput, the sync breakdown of the timed
steps, MFU. The loop tells it what ran; it hands back TensorBoard values."""
import time

import numpy as np

from dist_keras.measure import breakdown
from dist_keras.measure import costmodel
from dist_keras.measure import timing

_WINDOW_MS = "meters.window_ms"  # The record's array of window step times.


class RunMeters:
  """Throughput, sync breakdown and utilisation over a run's log windows."""

  def __init__(self, global_batch_size: int, replicas: int, utilisation,
               gradient_bytes: int):
    self.global_batch_size, self.replicas = global_batch_size, replicas
    self.utilisation = utilisation
    # The variables' dense count until the first call counts what it sent.
    self.traffic = costmodel.Traffic(gradient_bytes)
    self.throughput = timing.Throughput(global_batch_size)
    self.sync_log = breakdown.SyncLog()
    self.window = timing.Window()
    self.calls = timing.CallTimes()  # This process's: what calibration reads.
    # A resumed run's: what its figures cover (training/segments.py).
    self.segments = None
    # Wall seconds paused out of the closed windows (evals, checkpoints,
    # epoch ends; not the final eval, after the last window): this
    # process's and the processes' before it, as a checkpoint keeps them.
    self.paused_seconds = 0.0

  def ran(self, steps: int, out: dict) -> None:
    """Counts a call of `steps` steps; keeps the sync breakdown of a timed
    step but the one that traced the function (the process's first: it
    also started the input pipeline, which a resume makes skip). `out`'s
    "started" is when the call began (calls.Calls), its results read since."""
    seconds = time.perf_counter() - out.get("started", time.perf_counter())
    self.window.ran(steps, "traced" in out, seconds)
    if "traced" not in out and "started" in out:
      self.calls.add(steps, seconds)
    if "sent_bytes" in out:
      self.traffic = costmodel.Traffic(
          *(int(b) for b in np.asarray(out["sent_bytes"])))
    if "stamps" not in out or "traced" in out:
      return
    stamped = [np.asarray(out[k]) for k in ("step_start", "inputs_ready",
                                            "stamps")]
    if "job_durations" in out:
      self.window.breakdown = breakdown.split_step(
          *stamped, np.asarray(out["job_durations"]))
    else:  # A model's own train_step: not split further.
      self.window.breakdown = breakdown.whole_step(*stamped)

  def close_window(self) -> tuple[dict, float]:
    """Ends the log window: (its perf/ and sync/ values, seconds per step;
    None for a window of no steps, which a divergence's go-back emptied)."""
    window, self.window = self.window, timing.Window()
    seconds = window.elapsed()
    self.paused_seconds += window.paused_seconds
    values = {}
    # The calls that traced a function left out.
    steps, counted = (window.steps - window.traced_steps,
                      seconds - window.traced_seconds)
    throughput = self.throughput.add(steps, counted)  # Not the warm-up.
    if throughput:
      eps = self.global_batch_size * steps / counted
      values.update({"perf/step_ms": 1e3 * counted / steps,
                     "perf/examples_per_sec": eps,
                     "perf/examples_per_sec_per_replica": eps / self.replicas,
                     **self.utilisation.scalars(eps),
                     # What perf/mfu divides by (per device; x peak_devices):
                     # a measured peak is timed by each process, so MFU can
                     # jump at a resume where the throughput did not.
                     "perf/peak_tflops": self.utilisation.peak.tflops})
    outside, callbacks = window.outside()
    host = {"outside_ms": 1e3 * outside, "callbacks_ms": 1e3 * callbacks}
    if window.breakdown:
      values.update(self.sync_log.add({**window.breakdown, **host}))
      values["sync/gradient_bytes"] = self.traffic.allreduced
      if self.traffic.gathered:
        values["sync/gathered_bytes"] = self.traffic.gathered
    elif throughput:  # No timed step; the host's clocks cost nothing.
      values.update(self.sync_log.add_host(host))
    return values, (seconds / window.steps if window.steps else None)

  def host_figures(self) -> tuple[float, float]:
    """This worker's window so far, for the timed call about to start:
    (host seconds outside the calls, of which in the users' callbacks) per
    step, that step counted (stamps.durations_row hands them on)."""
    return self.window.outside(steps_ahead=1)

  def in_callbacks(self, seconds: float) -> None:
    """Counts time in the users' callbacks (actions.UsersClock)."""
    self.window.in_callbacks(seconds)

  def kept(self, arrays: dict) -> dict:
    """What the throughput and the sync means are computed from, for a
    checkpoint's record (the windows' step times into `arrays`)."""
    arrays[_WINDOW_MS] = np.asarray(self.throughput.window_ms, np.float64)
    return {"steps": self.throughput.steps,
            "seconds": self.throughput.seconds,
            "sync_steps": self.sync_log.count, "sync_sums": self.sync_log.sums,
            "sync_host_only": self.sync_log.host_only,
            "paused_seconds": self.paused_seconds}

  def carry_on(self, kept: dict, arrays: dict) -> None:
    """Goes on from `kept` (the record of the checkpoint a run resumed
    from): this process's windows add to the processes' before it; its
    first window is still its warm-up."""
    self.throughput.steps, self.throughput.seconds = (kept["steps"],
                                                      kept["seconds"])
    self.throughput.window_ms = arrays[_WINDOW_MS].tolist()
    # (An older checkpoint kept no host figures of windows without a timed
    # step: 0 of them.)
    self.sync_log = breakdown.SyncLog(kept["sync_steps"], kept["sync_sums"],
                                      kept.get("sync_host_only", 0))
    # (A checkpoint written before 2026-12-06 kept none.)
    self.paused_seconds = kept.get("paused_seconds", 0.0)

  def seconds_left(self, steps_left: int, window_seconds: float) -> float:
    """The ETA: the run's counted step time, else the last window's."""
    return steps_left * (self.throughput.step_seconds or window_seconds)

  def pause(self) -> None:
    """Eval, checkpoints and epoch ends are not train-step time."""
    self.window.pause()

  def resume(self) -> None:
    self.window.resume()
