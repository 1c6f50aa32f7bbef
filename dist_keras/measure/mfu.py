"""Model FLOPs utilisation (MFU): achieved model FLOP/s over peak FLOP/s.

achieved = training FLOPs per example (measure/flops.py: analytic, 3 x
forward; None if any call could not be counted) x examples/s;
MFU = achieved / (peak per device x devices).
The peak per device, in order:
  1. `log.peak_tflops` when set ("configured");
  2. a table of accelerators' dense peaks, by device name and precision
     ("table:<name>");
  3. a measured matmul ("measured matmul"): on CPUs always, on a GPU the
     table does not know. Timed as the run starts (for the values logged
     while it trains) and again after its last step, the higher kept for
     summary.json and the last line: on a shared host a reading taken
     while other work holds the cores is low, and an MFU over it too high
     (though often still under 100%, so nothing looks wrong).
On CPU the devices are the WORKER PROCESSES: dist_keras's logical CPU
devices split a process's cores only nominally (they share TensorFlow's one
intra-op thread pool), so one large matmul using every thread measures the
process's peak, and N logical devices in it do not multiply it. Workers on
one machine each count the chief's peak: right when each has cores of its
own (pinned), more than the machine has when they share them.
"""
import dataclasses
import os
import time

import tensorflow as tf

from dist_keras import installation
from dist_keras.measure import flops
from dist_keras.measure import peak_tables

MATMUL_SECONDS = 0.5  # Time one reading of a measured peak takes.
MEASURED = "measured matmul"
# The best matmul reading of this process by (dtype, device): its later runs
# (a notebook's, a test session's) start from it instead of timing again.
_BEST = {}


@dataclasses.dataclass(frozen=True)
class Peak:
  """Peak FLOP/s of the devices a run trains on.

  Attributes:
    tflops: peak TFLOP/s per device (per worker on CPU), None if unknown.
    source: 'configured', 'table:<name>', 'measured matmul', or why unknown.
    devices: devices (accelerators in sync, or worker processes on CPU).
    unit: 'device' or 'worker'.
    timings: a measured peak's readings, ((when, TFLOP/s), ...); `tflops`
      is the highest.
    matmul: a measured peak's (dtype, device), to time it again.
  """
  tflops: float | None
  source: str
  devices: int
  unit: str = "device"
  timings: tuple = ()
  matmul: tuple = ()

  @property
  def total_tflops(self) -> float | None:
    return self.tflops * self.devices if self.tflops else None

  def timed_again(self, when: str) -> "Peak":
    """A measured peak with one more reading, taken now: the higher
    kept. Any other peak as it is."""
    if self.source != MEASURED:
      return self
    reading = measure_matmul_tflops(*self.matmul)
    _BEST[self.matmul] = max(_BEST.get(self.matmul, 0.0), reading)
    return dataclasses.replace(self, tflops=max(self.tflops, reading),
                               timings=(*self.timings, (when, reading)))

  def readings(self) -> str:
    """'; timed 31.2 GFLOP/s at the start, 152 GFLOP/s at the end: the
    higher kept' for a peak timed more than once, else ''."""
    if len(self.timings) < 2:
      return ""
    said = ", ".join(f"{_si(tflops * 1e12)}FLOP/s at the {when}"
                     for when, tflops in self.timings)
    return f"; timed {said}: the higher kept"


def _measured(dtype: str, device: str, devices: int, unit: str) -> Peak:
  """A run's start peak: this process's best reading, timed now if it
  has none."""
  if (dtype, device) not in _BEST:
    _BEST[dtype, device] = measure_matmul_tflops(dtype, device)
  reading = _BEST[dtype, device]
  return Peak(reading, MEASURED, devices, unit, (("start", reading),),
              (dtype, device))


# One function for every reading (a run times two) and side tried:
# reduce_retracing traces one for any side (TensorFlow warns about a
# function traced once per shape, or defined again for each reading).
@tf.function(reduce_retracing=True)
def _matmul(a, b):
  return tf.reduce_sum(tf.matmul(a, b))  # One scalar back: a sync point.


def measure_matmul_tflops(dtype: str = "float32",
                          device: str = "/cpu:0") -> float:
  """Best TFLOP/s of one square matmul on `device`, over about
  MATMUL_SECONDS (read at each call: tests shorten it).

  The side doubles from 512 until one matmul takes >= 20 ms (at most
  8192), so the matmul is large enough to reach the peak on a CPU or a
  GPU; then it repeats until that time has passed. Inputs are constants,
  not random, so the run's random streams are untouched.
  """

  def timed(n: int) -> tuple[float, float]:
    """(TFLOP/s, seconds) of one n x n matmul (traced already)."""
    with tf.device(device):
      a = tf.fill((n, n), tf.constant(0.5, dtype))
      start = time.perf_counter()
      _matmul(a, a).numpy()
      elapsed = time.perf_counter() - start
    return 2 * n**3 / elapsed / 1e12, elapsed

  n, deadline = 512, time.perf_counter() + MATMUL_SECONDS
  timed(n)  # Traces.
  best, elapsed = timed(n)
  while elapsed < 0.02 and n < 8192:
    n *= 2
    timed(n)  # Warms this size up (a first one traces).
    best, elapsed = timed(n)
  while time.perf_counter() < deadline:
    best = max(best, timed(n)[0])
  return best


def find_peak(strategy, precision: str, configured_tflops: float, workers: int,
              measure: bool = True) -> Peak:
  """The peak per device of `strategy`'s devices at `precision`.

  Args:
    strategy: the run's strategy.
    precision: train.precision (float32 | bfloat16 | float16).
    configured_tflops: log.peak_tflops; > 0 wins over everything.
    workers: worker processes in the job (on CPU, what MFU divides by:
      a worker's logical CPU devices share its cores).
    measure: whether a matmul may be timed (False on non-chief workers:
      only the chief reports).
  """
  kind = device_kind(strategy)
  devices = workers if kind == "CPU" else strategy.num_replicas_in_sync
  unit = "worker" if kind == "CPU" else "device"
  if configured_tflops > 0:
    return Peak(configured_tflops, "configured", devices, unit)
  if kind == "TPU":
    name = os.environ.get("TPU_ACCELERATOR_TYPE", "")
    found = peak_tables.tpu_peak(name, precision)
    if found:
      return Peak(found[1], f"table:{found[0]}", devices)
    return Peak(None, f"unknown TPU {name or '(TPU_ACCELERATOR_TYPE unset)'} "
                f"at {precision}", devices)
  if kind == "GPU":
    found = peak_tables.gpu_peak(
        _gpu_name(), precision,
        tf.config.experimental.tensor_float_32_execution_enabled())
    if found:
      return Peak(found[1], f"table:{found[0]}", devices)
  if not measure:
    return Peak(None, "not measured on this worker", devices, unit)
  dtype = "float32" if precision == "float32" else precision
  device = "/gpu:0" if kind == "GPU" else "/cpu:0"
  return _measured(dtype, device, devices, unit)


def device_kind(strategy) -> str:
  """TPU, GPU or CPU: what `strategy`'s replicas run on."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return "TPU"
  devices = getattr(strategy.extended, "worker_devices", ())
  return "GPU" if any("GPU" in d.upper() for d in devices) else "CPU"


def _gpu_name() -> str:
  gpus = tf.config.list_physical_devices("GPU")
  if not gpus:
    return ""
  return tf.config.experimental.get_device_details(gpus[0]).get(
      "device_name", "")


@dataclasses.dataclass
class Utilisation:
  """FLOPs per example and peak of a run; turns examples/s into MFU."""
  flops: flops.FlopCount
  peak: Peak
  precision: str

  def achieved_tflops(self, examples_per_sec: float) -> float | None:
    if not self.flops.known:
      return None
    return self.flops.training * examples_per_sec / 1e12

  def mfu(self, examples_per_sec: float | None) -> float | None:
    if not (examples_per_sec and self.peak.total_tflops and self.flops.known):
      return None
    return self.achieved_tflops(examples_per_sec) / self.peak.total_tflops

  def time_peak_again(self, examples_per_sec: float | None) -> None:
    """Times a measured peak again, once the run's timed steps are done
    (its cost outside them), where an MFU will be reported."""
    if examples_per_sec and self.flops.known:
      self.peak = self.peak.timed_again("end")

  def scalars(self, examples_per_sec: float) -> dict:
    """TensorBoard values for one logged step (perf/mfu None if unknown)."""
    return {"perf/model_tflops": self.achieved_tflops(examples_per_sec),
            "perf/mfu": self.mfu(examples_per_sec)}

  def summary(self, examples_per_sec: float | None) -> dict:
    """summary.json fields."""
    return {"flops_per_example": self.flops.training,
            "flops_uncounted": self.flops.uncounted,
            "peak_tflops": self.peak.tflops,
            "peak_source": self.peak.source,
            "peak_devices": self.peak.devices,
            # A measured peak's readings ({"start": TFLOP/s, "end": ...}).
            "peak_timed": dict(self.peak.timings) or None,
            "mfu": self.mfu(examples_per_sec)}

  def line(self, examples_per_sec: float | None) -> str:
    """One console line: FLOPs per example, achieved FLOP/s and MFU."""
    if not self.flops.known:  # What was not counted: the start's line.
      return ("model FLOPs unknown (not counted: "
              f"{_calls(len(self.flops.uncounted))}, named at the start): "
              "no FLOP/s or MFU; " + installation.see_docs(
                  "mfu.md", "the layers counted", "Documentation"))
    text = (f"model {_si(self.flops.training)}FLOP/example (analytic, "
            "training = 3x forward)")
    if not examples_per_sec:
      return text + "; no throughput measured (too few logged steps)"
    text += f"; {_si(self.achieved_tflops(examples_per_sec) * 1e12)}FLOP/s achieved"
    mfu = self.mfu(examples_per_sec)
    if mfu is None:
      return (text + f"; MFU unknown (peak: {self.peak.source}); set "
              "log.peak_tflops to the peak TFLOP/s per device")
    per = (f" = {self.peak.devices} {self.peak.unit}s x "
           f"{_si(self.peak.tflops * 1e12)}FLOP/s"
           if self.peak.devices > 1 else "")
    text = (f"{text} = {100 * mfu:.1f}% MFU of "
            f"{_si(self.peak.total_tflops * 1e12)}FLOP/s ({self.peak.source} "
            f"peak, {self.precision}{per}{self.peak.readings()})")
    if mfu > 1:  # A matmul timed on a busy host, or a wrong table/setting.
      text += ("; over 100%: that peak is too low, set log.peak_tflops to "
               f"the {self.peak.unit}'s peak TFLOP/s")
    return text


def _calls(n: int) -> str:
  return f"{n} call" + ("s" if n > 1 else "")


def _si(value: float) -> str:
  """'1.23 G' style: three significant digits and an SI prefix."""
  for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                        ("k", 1e3)):
    if abs(value) >= scale:
      return f"{value / scale:.3g} {prefix}"
  return f"{value:.3g} "


def for_run(counted: flops.FlopCount, strategy, precision: str,
            peak_tflops: float, workers: int, chief: bool) -> Utilisation:
  """The Utilisation of a run: the model's FLOPs (`counted`) and the peak
  at train.precision (log.peak_tflops if set).

  Only the chief times a matmul (it alone reports); the others skip it.
  """
  peak = find_peak(strategy, precision, peak_tflops, workers, measure=chief)
  return Utilisation(counted, peak, precision)


def unknown_line(counted: flops.FlopCount) -> str:
  """The start's line naming every call not counted ('' if none)."""
  if counted.known:
    return ""
  return ("model FLOPs unknown, so no MFU; not counted: "
          + "; ".join(counted.uncounted))
