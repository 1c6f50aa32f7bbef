"""What a gradient all-reduce costs: the alpha-beta model of a ring all-reduce.

A ring all-reduce over n devices runs 2(n-1) steps (reduce-scatter, then
all-gather), each sending 1/n of the message to the next device, so

  t(n, S) = 2(n-1) * alpha + (S / B) * 2(n-1) / n

with alpha the per-step latency (seconds), S the message size (bytes) and B
the "bus bandwidth" (bytes/second) in the sense of the NCCL performance notes
(nccl-tests' busbw), which makes B comparable across device counts. On one
device there is nothing to send: t = 0.

`microbenchmark` times real all-reduces under a tf.distribute strategy, `fit`
recovers alpha and B from them, and tools/scaling_model.py turns the model
into step-time, speedup and efficiency predictions for N devices.

TensorFlow is imported only by the functions that measure: the model and the
fit are plain arithmetic, and the planning tool should not pay seconds of
TensorFlow start-up to print a table.
"""
import math
import statistics
import time
from typing import NamedTuple

import numpy as np

# 1 KiB, 4 KiB, ..., 64 MiB: from latency-bound to bandwidth-bound messages.
DEFAULT_SIZES = tuple(1024 * 4**k for k in range(9))
DEFAULT_REPEATS = 10
MIN_REPEATS = 3
# Wall-clock seconds per message size after which no more repeats are started
# (at least MIN_REPEATS run): big messages get fewer repeats.
DEFAULT_BUDGET_S = 1.0
_FLOAT32_BYTES = 4


class Traffic(NamedTuple):
  """Bytes one replica sends per step: `allreduced`, its dense gradients
  (summed by a ring all-reduce); `gathered`, an Embedding's gradient slices
  and their indices (TensorFlow all-gathers an IndexedSlices: nothing sums
  them on the way)."""
  allreduced: int
  gathered: int = 0


def allreduce_seconds(num_devices: int, message_bytes: float, alpha: float,
                      bandwidth: float) -> float:
  """Seconds a ring all-reduce of `message_bytes` takes on `num_devices`.

  Args:
    num_devices: devices in the ring (>= 1).
    message_bytes: bytes each device contributes (>= 0).
    alpha: latency of one ring step, seconds (>= 0).
    bandwidth: bus bandwidth, bytes/second (> 0; inf means free transfer).

  Raises:
    ValueError: a value out of the ranges above.
  """
  _check_link(num_devices, message_bytes, alpha, bandwidth)
  if num_devices == 1:
    return 0.0
  steps = 2 * (num_devices - 1)
  return alpha * steps + (message_bytes / bandwidth) * steps / num_devices


def allgather_seconds(num_devices: int, message_bytes: float, alpha: float,
                      bandwidth: float) -> float:
  """Seconds a ring all-gather takes when each of `num_devices` contributes
  `message_bytes` (arguments as allreduce_seconds'): n-1 steps, each
  passing one device's whole part on, t = (n-1) * (alpha + S / B), with B
  the bus bandwidth as nccl-tests reports it for an all-gather."""
  _check_link(num_devices, message_bytes, alpha, bandwidth)
  return (num_devices - 1) * (alpha + message_bytes / bandwidth)


def sync_seconds(num_devices: int, traffic: Traffic, alpha: float,
                 bandwidth: float) -> float:
  """Seconds a step's gradient synchronisation takes: the all-reduce of the
  dense gradients, then the all-gather of the gathered ones (if any)."""
  seconds = allreduce_seconds(num_devices, traffic.allreduced, alpha,
                              bandwidth)
  if traffic.gathered:
    seconds += allgather_seconds(num_devices, traffic.gathered, alpha,
                                 bandwidth)
  return seconds


def _check_link(num_devices, message_bytes, alpha, bandwidth) -> None:
  _check_devices(num_devices, minimum=1)
  if not message_bytes >= 0:
    raise ValueError(f"message_bytes={message_bytes!r} must be >= 0.")
  if not (alpha >= 0 and math.isfinite(alpha)):
    raise ValueError(f"alpha={alpha!r} must be a finite number of seconds "
                     ">= 0.")
  if not bandwidth > 0:
    raise ValueError(f"bandwidth={bandwidth!r} must be > 0 bytes/second.")


def fit(num_devices: int, sizes_bytes, seconds) -> tuple[float, float]:
  """Least-squares (alpha, bandwidth) of the ring model to measured points.

  The model is linear in S, t = a + b*S with a = 2(n-1)*alpha and
  b = 2(n-1)/(n*B), so this is a straight-line fit. It minimises RELATIVE
  residuals ((t_i - a - b*S_i) / t_i): sizes span five orders of magnitude,
  and plain residuals let the largest messages (tens of ms) decide alone, so
  the latency the small ones (tens of us) show is lost in their noise. A
  negative intercept is clamped by refitting through the origin, which is
  the least-squares fit under alpha >= 0.

  Args:
    num_devices: devices the points were measured on (>= 2).
    sizes_bytes: message sizes, bytes; at least two distinct ones.
    seconds: the measured time of each size.

  Returns:
    (alpha in seconds, bandwidth in bytes/second), alpha >= 0 and bandwidth
    finite and > 0.

  Raises:
    ValueError: fewer than 2 devices, too few or invalid points, or times
      that do not grow with size (no bandwidth can be fitted).
  """
  _check_devices(num_devices, minimum=2)
  s = np.asarray(sizes_bytes, dtype=np.float64)
  t = np.asarray(seconds, dtype=np.float64)
  if s.ndim != 1 or s.shape != t.shape:
    raise ValueError(f"{s.size} sizes but {t.size} times; pass one time per "
                     "size.")
  if not (np.all(np.isfinite(s)) and np.all(s > 0)
          and np.all(np.isfinite(t)) and np.all(t > 0)):
    raise ValueError("sizes and times must be finite and > 0; drop the bad "
                     "points.")
  if np.unique(s).size < 2:
    raise ValueError(f"{np.unique(s).size} distinct message size(s); a line "
                     "needs at least 2.")
  w = 1.0 / t**2  # Weights that make the residuals relative.
  s_mean, t_mean = np.dot(w, s) / w.sum(), np.dot(w, t) / w.sum()
  # Centred sums: sizes reach 1e8, whose squares would swamp float64 sums.
  ds = s - s_mean
  slope = float(np.dot(w * ds, t - t_mean) / np.dot(w * ds, ds))
  intercept = float(t_mean - slope * s_mean)
  if intercept < 0:
    slope, intercept = float(np.dot(w * s, t) / np.dot(w * s, s)), 0.0
  if not slope > 0:
    raise ValueError(
        f"all-reduce time does not grow with message size (fitted slope "
        f"{slope:.3g} s/byte); measure larger messages (max_bytes) or more "
        "repeats.")
  steps = 2 * (num_devices - 1)
  return intercept / steps, steps / (num_devices * slope)


def microbenchmark(strategy, sizes_bytes=DEFAULT_SIZES,
                   repeats: int = DEFAULT_REPEATS, max_bytes=None,
                   budget_s: float = DEFAULT_BUDGET_S):
  """Times a SUM all-reduce of float32 tensors under `strategy`.

  Each size gets its own tf.function: one untimed call traces it and sets up
  the collective, then up to `repeats` timed calls (fewer once `budget_s` of
  wall time is spent on the size, but at least MIN_REPEATS).

  Args:
    strategy: a tf.distribute strategy (e.g. MirroredStrategy).
    sizes_bytes: message sizes per replica, bytes (rounded down to whole
      float32 elements, at least one).
    repeats: timed calls per size (>= 1).
    max_bytes: sizes above this are skipped (None: no limit).
    budget_s: wall-clock seconds per size after which repeats stop early.

  Returns:
    [(bytes, median seconds), ...] in increasing size.

  Raises:
    ValueError: a bad `repeats`, or no size left under `max_bytes`.
  """
  if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats={repeats!r} must be an integer >= 1.")
  elements = sorted({max(1, int(b) // _FLOAT32_BYTES) for b in sizes_bytes
                     if max_bytes is None or b <= max_bytes})
  if not elements:
    raise ValueError(f"no message size is <= max_bytes={max_bytes!r}; raise "
                     "max_bytes or pass smaller sizes_bytes.")
  return [(n * _FLOAT32_BYTES,
           _median_seconds(strategy, n, repeats, budget_s))
          for n in elements]


def calibrate(strategy, max_bytes=None, repeats: int = DEFAULT_REPEATS,
              budget_s: float = DEFAULT_BUDGET_S) -> dict:
  """Measures this strategy's all-reduce and fits the ring model to it.

  Returns:
    {"alpha_s", "bandwidth_Bps", "points": [(bytes, seconds), ...],
    "num_devices"}. One replica has no communication: alpha 0, bandwidth
    inf and no points.
  """
  n = strategy.num_replicas_in_sync
  if n == 1:
    return {"alpha_s": 0.0, "bandwidth_Bps": math.inf, "points": [],
            "num_devices": 1}
  points = microbenchmark(strategy, repeats=repeats, max_bytes=max_bytes,
                          budget_s=budget_s)
  alpha, bandwidth = fit(n, [b for b, _ in points], [t for _, t in points])
  return {"alpha_s": alpha, "bandwidth_Bps": bandwidth, "points": points,
          "num_devices": n}


def _check_devices(num_devices, minimum: int) -> None:
  if (isinstance(num_devices, bool) or not isinstance(num_devices, int)
      or num_devices < minimum):
    why = " (one device has nothing to fit)" if minimum == 2 else ""
    raise ValueError(f"num_devices={num_devices!r} must be an integer >= "
                     f"{minimum}{why}.")


def _median_seconds(strategy, elements: int, repeats: int,
                    budget_s: float) -> float:
  """Median all-reduce seconds of `elements` float32s over timed calls."""
  timed = _timed_allreduce(strategy, elements)
  timed()  # Traces, and lets the collective set up its group: not timed.
  samples = []
  deadline = time.monotonic() + budget_s
  while len(samples) < repeats and (len(samples) < MIN_REPEATS
                                    or time.monotonic() < deadline):
    stamps = np.array([r.numpy() for r in timed()])  # [replica, (start, end)]
    # From the last replica's arrival to the last replica's departure: time
    # spent waiting for a late replica is skew, not communication. Local
    # replicas share one host clock, so their stamps compare.
    samples.append(float(stamps[:, 1].max() - stamps[:, 0].max()))
  return statistics.median(samples)


def _timed_allreduce(strategy, elements: int):
  """A tf.function returning each local replica's [start, end] timestamps.

  The clock is read in the graph (tf.timestamp) right before and after the
  all-reduce, not in Python around the call: Python-side timing would add
  the tf.function dispatch and the result copy-back to every point (about
  0.4 ms on the 2-core test machine, where a 1 KB all-reduce takes 0.08 ms),
  which the fit would misread as link latency.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras.measure import stamps

  def replica_fn():
    x = tf.fill([elements], 1.0)
    start = stamps.stamp_after(x)
    x = stamps.after_stamp(start, x)  # The all-reduce may not start before it.
    y = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, x)
    return tf.stack([start, stamps.stamp_after(y)])

  @tf.function
  def timed():
    return strategy.experimental_local_results(strategy.run(replica_fn))

  return timed
