"""Wall-clock timing of the train loop: log windows, throughput, jitter.

Timing hygiene (as big_vision's chrono and nanoGPT do): the first window,
which includes tracing and compilation, is left out of throughput, and so
is a later call that traced and compiled its function (after a resume, or
with train.log_every=2, the two step functions' first calls fall in
different windows); the clock is read only after the step's results
reached the host (the loop reads the loss first); checkpoints and eval
are paused out of the window.
"""
import dataclasses
import time

import numpy as np


@dataclasses.dataclass
class Throughput:
  """Wall-clock step timing that leaves out the first (tracing) interval."""
  examples_per_step: int
  seconds: float = 0.0
  steps: int = 0
  warmup_done: bool = False
  # Wall ms per step of each counted interval (log window), for the jitter.
  window_ms: list = dataclasses.field(default_factory=list)

  def add(self, steps: int, seconds: float) -> bool:
    """Counts an interval; returns False for the warm-up one and for one
    of no steps (not counted)."""
    if not self.warmup_done:
      self.warmup_done = True
      return False
    if not steps:
      return False
    self.seconds += seconds
    self.steps += steps
    self.window_ms.append(1e3 * seconds / steps)
    return True

  @property
  def step_seconds(self) -> float | None:
    return self.seconds / self.steps if self.steps else None

  @property
  def examples_per_sec(self) -> float | None:
    return self.examples_per_step / self.step_seconds if self.steps else None


@dataclasses.dataclass
class CallTimes:
  """Wall time per step of the calls of each size (steps a call), from the
  call until the loop has read its results: a step without what runs
  between calls (callbacks, logging, checkpoints, eval), as the
  calibration's ideal step is timed (calibration.py). Calls that traced
  are left out."""
  by_size: dict = dataclasses.field(default_factory=dict)  # {steps: [s, n]}

  def add(self, steps: int, seconds: float) -> None:
    seconds_and_steps = self.by_size.setdefault(steps, [0.0, 0])
    seconds_and_steps[0] += seconds
    seconds_and_steps[1] += steps

  def largest(self) -> tuple[int, float] | None:
    """(the largest call size timed, its seconds per step); None if none."""
    if not self.by_size:
      return None
    size = max(self.by_size)
    seconds, steps = self.by_size[size]
    return size, seconds / steps


def step_time_stats(window_ms) -> dict:
  """Median and 90th percentile of the log windows' wall ms per step, and
  their jitter: std / mean in % (None below 2 windows; all None for none)."""
  if not len(window_ms):
    return {"step_ms_median": None, "step_ms_p90": None,
            "step_ms_jitter": None}
  ms = np.asarray(window_ms, np.float64)
  return {"step_ms_median": float(np.median(ms)),
          "step_ms_p90": float(np.percentile(ms, 90)),
          "step_ms_jitter": (float(100 * ms.std() / ms.mean())
                             if len(ms) > 1 else None)}


def throughput_line(examples_per_sec: float, stats: dict) -> str:
  """'throughput 1,234 ex/s (step 12.3 ms median, p90 13.0 ms, jitter 2.1%)'."""
  jitter = stats["step_ms_jitter"]
  return (f"throughput {examples_per_sec:,.0f} ex/s (step "
          f"{stats['step_ms_median']:.1f} ms median, p90 "
          f"{stats['step_ms_p90']:.1f} ms, jitter "
          + (f"{jitter:.1f}%)" if jitter is not None else "n/a: one window)"))


def eta(seconds: float | None) -> str:
  if seconds is None:
    return "--:--"
  minutes, secs = divmod(int(seconds), 60)
  return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class Window:
  """The steps since the last log line, and their wall time."""

  def __init__(self):
    self.steps = 0
    self.breakdown = None  # sync.breakdown of the window's timed step.
    # Of the calls that traced and compiled their function (with the hooks
    # before them): not throughput.
    self.traced_steps, self.traced_seconds = 0, 0.0
    # Of the other calls: inside them (from the call until its results
    # were read) and in the users' callbacks between them.
    self.in_calls, self.callbacks = 0.0, 0.0
    self._callbacks_since = 0.0  # Since the last call: its gap's.
    self._seconds, self._paused = 0.0, 0
    self.paused_seconds = 0.0  # Of the pauses ended in the window.
    self._start = self._since = time.perf_counter()

  def ran(self, steps: int, traced: bool, call_seconds: float = 0.0) -> None:
    """Counts a call that has just ended, which took `call_seconds`."""
    now = time.perf_counter()
    self.steps += steps
    if traced:  # Its gap is left out with it.
      self.traced_steps += steps
      self.traced_seconds += now - self._since
    else:
      self.in_calls += call_seconds
      self.callbacks += self._callbacks_since
    self._since, self._callbacks_since = now, 0.0

  def in_callbacks(self, seconds: float) -> None:
    """Counts `seconds` in the users' callbacks, since the last call."""
    self._callbacks_since += seconds

  def outside(self, steps_ahead: int = 0) -> tuple[float, float]:
    """(host seconds outside the calls, of which in the users' callbacks)
    per step of the window's calls that did not trace, so far; with
    `steps_ahead`, as if that many more steps ran now without time
    (a call about to start: its gap is over)."""
    steps = self.steps - self.traced_steps + steps_ahead
    if steps <= 0:
      return 0.0, 0.0
    counted = self.elapsed() - self.traced_seconds
    callbacks = self.callbacks + (self._callbacks_since if steps_ahead else 0)
    return (max(counted - self.in_calls, 0.0) / steps, callbacks / steps)

  def pause(self):
    """Stops the clock; pauses nest (a checkpoint saved at the epoch end
    the loop has paused for): only the outermost counts, or the time
    between the two, the eval, would be added."""
    self._paused += 1
    if self._paused == 1:
      self._seconds += time.perf_counter() - self._start
      self._paused_at = time.perf_counter()

  def resume(self):
    self._paused -= 1
    if not self._paused:
      self._start = self._since = time.perf_counter()
      self.paused_seconds += self._start - self._paused_at

  def elapsed(self) -> float:
    if self._paused:
      return self._seconds
    return self._seconds + time.perf_counter() - self._start
