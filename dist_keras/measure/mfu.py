"""Model FLOPs utilisation (MFU): achieved model FLOP/s over peak FLOP/s.

achieved = training FLOPs per example (measure/flops.py: analytic, 3 x
forward; None if any call could not be counted) x examples/s;
MFU = achieved / (peak per device x devices).
The peak per device, in order:
  1. `log.peak_tflops` when set ("configured");
  2. a table of accelerators' dense peaks, by device name and precision
     ("table:<name>");
  3. a measured matmul ("measured matmul"): on CPUs always, on a GPU the
     table does not know.
On CPU the devices are the WORKER PROCESSES: dist_keras's logical CPU
devices split a process's cores only nominally (they share TensorFlow's one
intra-op thread pool), so one large matmul using every thread measures the
process's peak, and N logical devices in it do not multiply it. Workers on
one machine each count the chief's peak: right when each has cores of its
own (pinned), more than the machine has when they share them.
"""
import dataclasses
import functools
import os
import re
import time

import tensorflow as tf

from dist_keras import installation
from dist_keras.measure import flops

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU, from NVIDIA's datasheets:
# A100 (nvidia.com/en-us/data-center/a100, 2021), H100 SXM and PCIe
# (nvidia.com/en-us/data-center/h100; its table states sparse figures:
# halved here), V100 (SXM2 / PCIe), T4, L4 (datasheets; L4's tensor
# figures are sparse: halved). "tf32" is what TensorFlow runs float32
# matmuls and convs in on Ampere and later while TensorFloat-32 is on (its
# default: tf.config.experimental.enable_tensor_float_32_execution).
# Matched in order: the first pattern found in the lower-cased device name
# (e.g. 'NVIDIA A100-SXM4-40GB', 'Tesla V100-PCIE-16GB') wins. An H100 NVL
# matches 'H100 SXM', which may overstate it: set log.peak_tflops there.
GPU_PEAKS = (
    ("H100 PCIe", r"\bh100\b.*\bpcie\b",
     {"bfloat16": 756.0, "float16": 756.0, "tf32": 378.0, "float32": 51.2}),
    ("H100 SXM", r"\bh100\b",
     {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.7, "float32": 66.9}),
    ("A100", r"\ba100\b",
     {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5}),
    ("L4", r"\bl4\b",
     {"bfloat16": 121.0, "float16": 121.0, "tf32": 60.0, "float32": 30.3}),
    # Volta and Turing have no bfloat16 tensor cores: no bfloat16 entry.
    ("V100 PCIe", r"\bv100\b.*\bpcie\b", {"float16": 112.0, "float32": 14.0}),
    ("V100 SXM2", r"\bv100\b", {"float16": 125.0, "float32": 15.7}),
    ("T4", r"\bt4\b", {"float16": 65.0, "float32": 8.1}),
)
# Peak bf16 TFLOP/s per TPU CHIP, from Google Cloud's TPU pages
# (cloud.google.com/tpu/docs/v2, v3, v4, v5e, v5p, v6e), and the TensorFlow
# devices (replicas) per chip: v2 and v3 chips have two TensorCores, each
# its own device; v4 and v5p join theirs into one megacore device; v5e and
# v6e have one. TPUs run float32 matmuls as bfloat16 multiplies with float32
# accumulation by default, so float32 uses the bf16 peak too.
TPU_PEAKS = {"v2": (45.0, 2), "v3": (123.0, 2), "v4": (275.0, 1),
             "v5e": (197.0, 1), "v5p": (459.0, 1), "v6e": (918.0, 1)}
_TPU_NAME = re.compile(r"v(\d)\s*(litepod|lite|e|p)?")

MATMUL_SECONDS = 0.5  # Time spent measuring a peak (once per process).


@dataclasses.dataclass(frozen=True)
class Peak:
  """Peak FLOP/s of the devices a run trains on.

  Attributes:
    tflops: peak TFLOP/s per device (per worker on CPU), None if unknown.
    source: 'configured', 'table:<name>', 'measured matmul', or why unknown.
    devices: devices (accelerators in sync, or worker processes on CPU).
    unit: 'device' or 'worker'.
  """
  tflops: float | None
  source: str
  devices: int
  unit: str = "device"

  @property
  def total_tflops(self) -> float | None:
    return self.tflops * self.devices if self.tflops else None


def gpu_peak(device_name: str, precision: str,
             tf32: bool = True) -> tuple[str, float] | None:
  """(table name, dense peak TFLOP/s) of a GPU at `precision`, or None."""
  name = device_name.lower()
  for table_name, pattern, peaks in GPU_PEAKS:
    if re.search(pattern, name):
      key = "tf32" if precision == "float32" and tf32 and "tf32" in peaks \
          else precision
      return (table_name, peaks[key]) if key in peaks else None
  return None


def tpu_peak(accelerator_type: str,
             precision: str) -> tuple[str, float] | None:
  """(table name, peak TFLOP/s per TensorFlow device) of a TPU, or None.

  `accelerator_type` as Cloud names it ('v4-8', 'v5litepod-16', 'v6e-8',
  'TPU v3'); bf16 and float32 share the peak (see TPU_PEAKS).
  """
  if precision not in ("bfloat16", "float32"):
    return None
  match = _TPU_NAME.search(accelerator_type.lower().replace("tpu", ""))
  if not match:
    return None
  version, variant = match.group(1), (match.group(2) or "").strip()
  key = f"v{version}" + ("e" if variant in ("lite", "litepod", "e") else
                         "p" if variant == "p" else "")
  if key not in TPU_PEAKS:
    return None
  per_chip, devices_per_chip = TPU_PEAKS[key]
  return f"TPU {key}", per_chip / devices_per_chip


@functools.lru_cache(maxsize=None)
def measure_matmul_tflops(dtype: str = "float32", device: str = "/cpu:0",
                          seconds: float = MATMUL_SECONDS) -> float:
  """Best TFLOP/s of one square matmul on `device`, over about `seconds`.

  The side doubles from 512 until one matmul takes >= 20 ms (at most
  8192), so the matmul is large enough to reach the peak on a CPU or a
  GPU; then it repeats until `seconds` have passed. Cached: measured once
  per process. Inputs are constants, not random, so the run's random
  streams are untouched.
  """

  # reduce_retracing: one trace for every side tried (TensorFlow warns about
  # a function traced once per shape).
  @tf.function(reduce_retracing=True)
  def matmul(a, b):
    return tf.reduce_sum(tf.matmul(a, b))  # One scalar back: a sync point.

  def timed(n: int) -> tuple[float, float]:
    """(TFLOP/s, seconds) of one n x n matmul (traced already)."""
    with tf.device(device):
      a = tf.fill((n, n), tf.constant(0.5, dtype))
      start = time.perf_counter()
      matmul(a, a).numpy()
      elapsed = time.perf_counter() - start
    return 2 * n**3 / elapsed / 1e12, elapsed

  n, deadline = 512, time.perf_counter() + seconds
  timed(n)  # Traces.
  best, elapsed = timed(n)
  while elapsed < 0.02 and n < 8192:
    n *= 2
    timed(n)  # Traces this size.
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
    found = tpu_peak(name, precision)
    if found:
      return Peak(found[1], f"table:{found[0]}", devices)
    return Peak(None, f"unknown TPU {name or '(TPU_ACCELERATOR_TYPE unset)'} "
                f"at {precision}", devices)
  if kind == "GPU":
    found = gpu_peak(
        _gpu_name(), precision,
        tf.config.experimental.tensor_float_32_execution_enabled())
    if found:
      return Peak(found[1], f"table:{found[0]}", devices)
  if not measure:
    return Peak(None, "not measured on this worker", devices, unit)
  dtype = "float32" if precision == "float32" else precision
  device = "/gpu:0" if kind == "GPU" else "/cpu:0"
  return Peak(measure_matmul_tflops(dtype, device), "measured matmul",
              devices, unit)


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
            "mfu": self.mfu(examples_per_sec)}

  def line(self, examples_per_sec: float | None) -> str:
    """One console line: FLOPs per example, achieved FLOP/s and MFU."""
    if not self.flops.known:
      more = len(self.flops.uncounted) - 1
      return (f"model FLOPs unknown ({self.flops.uncounted[0]}"
              + (f"; {more} more" if more else "") + "): no FLOP/s or MFU; "
              + installation.see_docs("mfu.md", "the layers counted",
                                      "Documentation"))
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
            f"peak, {self.precision}{per})")
    if mfu > 1:  # A matmul timed on a busy host, or a wrong table/setting.
      text += ("; over 100%: that peak is too low, set log.peak_tflops to "
               f"the {self.peak.unit}'s peak TFLOP/s")
    return text


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
