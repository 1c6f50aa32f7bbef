"""Gradient synchronisation: one explicit all-reduce per step.

Keras 3 optimizers SUM-all-reduce gradients inside `apply_gradients` (the
private `_all_reduce_sum_gradients`), and clip them BEFORE that reduction,
i.e. per replica. dist_keras reduces gradients itself instead, so that
clipping sees the global gradient and the all-reduce can be timed, and turns
the optimizer's own reduction off. That private hook lives here and only
here; tests/test_sync.py fails loudly if a Keras release moves it.
"""
import math

import numpy as np
import tensorflow as tf

_KERAS_HOOK = "_all_reduce_sum_gradients"


def disable_optimizer_allreduce(optimizer) -> None:
  """Makes `optimizer.apply_gradients` use the gradients as given.

  Raises:
    RuntimeError: this Keras has no such hook; gradients would be reduced
      twice (scaled by the replica count), so refuse to train.
  """
  if not callable(getattr(optimizer, _KERAS_HOOK, None)):
    raise RuntimeError(
        f"{type(optimizer).__name__} has no {_KERAS_HOOK}: this Keras "
        "release changed how optimizers all-reduce gradients; dist_keras "
        "needs updating (see dist_keras/sync.py).")
  setattr(optimizer, _KERAS_HOOK, lambda grads_and_vars: list(grads_and_vars))
  # A LossScaleOptimizer's inner optimizer is the one that updates.
  inner = getattr(optimizer, "inner_optimizer", None)
  if inner is not None:
    disable_optimizer_allreduce(inner)


def dense_gradients(grads):
  """Gradients as dense tensors, so one packed all-reduce carries them all.

  Embedding gradients arrive as IndexedSlices; densifying one is a
  scatter-add over every looked-up token (6,400 rows per replica for the
  default LSTM), i.e. the end of the backward pass. The loop does it BEFORE
  the grads-ready stamp: after it, the scatter was counted as all-reduce
  time (measured 0.85 ms instead of 0.23 ms for a 0.18 ms collective).
  """
  return [tf.convert_to_tensor(g) if g is not None else None for g in grads]


ALLREDUCE_DTYPES = ("float32", "bfloat16", "float16")


def all_reduce_gradients(grads, dtype: str = "float32",
                         bytes_per_pack: int = 0):
  """SUM-all-reduces per-replica gradients across replicas (call in replica).

  Each replica's loss is already divided by the GLOBAL batch size, so the sum
  is the gradient of the global mean loss. IndexedSlices are densified
  (dense_gradients) if the caller has not done so. A 16-bit `dtype`
  compresses the all-reduce (Horovod's fp16 compression): gradients are cast
  for the collective and the sums cast back, halving the bytes sent at the
  price of summing in 16 bits (float16: 3 decimal digits, overflow above
  65504; bfloat16: 2-3 digits, float32's range). `bytes_per_pack` > 0
  splits the collective into packs of about that many bytes (per call, so
  it overrides the strategy's CommunicationOptions; TF's collective
  implementations use it: MultiWorkerMirroredStrategy, not Mirrored on CPUs,
  which reduces to one device).
  """
  dense = dense_gradients(grads)
  ctx = tf.distribute.get_replica_context()
  present = [g for g in dense if g is not None]
  if dtype != "float32":
    present = [tf.cast(g, dtype) for g in present]
  options = tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=bytes_per_pack)
  reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, present, options)
  reduced = iter([tf.cast(r, g.dtype) for r, g in zip(
      reduced, [g for g in dense if g is not None])])
  return [next(reduced) if g is not None else None for g in dense]


def host_value_sum(strategy):
  """A tf.function `(float) -> its sum over every replica of the job`.

  For the host to agree with the other workers on a number (a resume step,
  a stop request): each replica contributes this process's value.
  """

  @tf.function  # Eager collectives under MWMS are slow and warn.
  def total(value):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
        lambda: tf.identity(value)), axis=None)

  return lambda value: float(total(tf.constant(value, tf.float64)))


def gradient_bytes(variables, allreduce_dtype: str = "float32") -> int:
  """Bytes one replica sends into the all-reduce: every trainable variable,
  in float32 or in the 16-bit `allreduce_dtype` that compresses it."""
  itemsize = {"bfloat16": 2, "float16": 2}.get(allreduce_dtype)
  return sum(math.prod(v.shape) * (itemsize or np.dtype(v.dtype).itemsize)
             for v in variables)


# --- In-graph step breakdown -------------------------------------------------
# tf.timestamp() runs when the graph reaches it, not when Python traces it, so
# every stamp is tied by control dependencies to what it measures: a stamp
# waits for its inputs, and the next phase waits for the stamp.
#
# A bare tf.timestamp() is a stateful op without resource inputs, and
# tf.function's automatic control dependencies run ALL such ops in program
# order: replica 1's first stamp then waits for replica 0's gradients, which
# serialised the replicas (measured: instrumented step 36 ms vs 26 ms plain,
# LSTM, 2 logical CPUs). So each replica's stamps read a per-replica "clock"
# variable: ops with a resource input are ordered per resource, i.e. per
# replica, and the replicas run concurrently as in the plain step.

def make_clock(strategy) -> tf.Variable:
  """The per-replica resource that orders each replica's stamps."""
  with strategy.scope():
    return tf.Variable(0.0, trainable=False, name="sync_clock")


@tf.function(autograph=False)
def _timestamp_reading(clock_handle, deps):
  with tf.control_dependencies([deps, tf.raw_ops.ReadVariableOp(
      resource=clock_handle, dtype=tf.float32)]):
    return tf.timestamp()


def stamp_after(tensors, clock=None):
  """A tf.timestamp() taken once every tensor in `tensors` exists.

  With `clock` (replica context), the stamp is ordered per replica only.
  """
  deps = [t for t in tf.nest.flatten(tensors) if t is not None]
  if clock is None:
    with tf.control_dependencies([_available(t) for t in deps]):
      return tf.timestamp()
  # A data dependency on one element of each tensor: control dependencies
  # of a function call do not survive its inlining.
  firsts = [tf.cast(tf.reshape(t, [-1])[:1], tf.float64) for t in deps]
  return _timestamp_reading(clock.handle,
                            tf.concat([*firsts, tf.zeros([1], tf.float64)], 0))


def _available(t):
  """Something that exists only once `t`'s values do (for the clock to wait).

  Accelerator ops run asynchronously (their kernel is launched, not
  finished, when the op completes), so on a GPU a control dependency on `t`
  alone could read the clock too early; copying one element to the host
  waits for the data. CPU ops are done when they complete: `t` itself will do.
  """
  device = tf.DeviceSpec.from_string(t.device or "")
  if device.device_type in (None, "CPU"):
    return t
  with tf.device(device.replace(device_type="CPU", device_index=0)):
    return tf.identity(tf.reshape(t, [-1])[:1])


def after_stamp(stamp, tensors):
  """`tensors`, made to wait for `stamp` (so the next phase starts later)."""
  with tf.control_dependencies([stamp]):
    return tf.nest.map_structure(
        lambda t: None if t is None else tf.identity(t), tensors)


# Per-replica stamps, in this order: inputs in hand, gradients computed,
# gradients all-reduced, update applied.
STAMPS = ("start", "grads_ready", "reduced", "end")


def gather_collective_wait(grads_ready, reduced, end):
  """Every replica's `reduced - grads_ready`, on every worker (in replica).

  A duration, not a time of day, so it compares across hosts whose clocks
  differ; gathered after the step's last stamp so it times nothing itself.
  """
  wait = after_stamp(end, tf.reshape(reduced - grads_ready, [1]))
  return tf.distribute.get_replica_context().all_gather(wait, axis=0)


def breakdown(step_start: float, inputs_ready: float, stamps,
              collective_waits=None) -> dict:
  """Splits one step into input wait, compute, straggler wait and all-reduce.

  Args:
    step_start: host stamp before asking for the next distributed batch.
    inputs_ready: stamp once every replica's batch is there.
    stamps: [local replicas, 4] array of STAMPS per replica, in seconds.
    collective_waits: `reduced - grads_ready` of EVERY replica in the job
      (gather_collective_wait); default: the local replicas' own, which is
      all of them on one host.

  Returns:
    Milliseconds (mean and max over the local replicas; per replica, the four
    parts add up to its step time exactly) and `fraction`, the share of the
    step spent synchronising (all-reduce + straggler wait). A replica's time
    in the reduction is straggler wait (until the last replica has its
    gradients) plus all-reduce. When every replica is local, one clock
    says when the last one arrived. When some are on other hosts, whose
    clocks differ, only durations are compared: the replica that arrives
    last waits for no one, so the shortest time in the reduction is the
    all-reduce proper and a replica's excess over it is straggler wait
    (this assumes the replicas finish the reduction together).
  """
  stamps = np.asarray(stamps, dtype=np.float64)
  start, ready, reduced, end = stamps.T
  waits = reduced - ready
  if collective_waits is None or len(collective_waits) == len(stamps):
    # Every replica is here, on one clock: the last arrival is known.
    straggler = ready.max() - ready
  else:
    # Replicas on other hosts, other clocks: durations only.
    straggler = np.maximum(waits - float(np.min(collective_waits)), 0.0)
  per_replica = {
      # Until the replica holds its batch: the host's wait for the next
      # distributed batch plus handing it to the replica.
      "input_wait_ms": np.maximum(start - step_start, 0.0),
      "compute_ms": (ready - start) + (end - reduced),
      "straggler_ms": straggler,
      "allreduce_ms": np.maximum(waits - straggler, 0.0),
  }
  out = {"batch_ready_ms": 1e3 * (inputs_ready - step_start),
         "step_ms": 1e3 * (end.max() - step_start)}
  for name, values in per_replica.items():
    out[name] = 1e3 * float(values.mean())
    out[name.replace("_ms", "_max_ms")] = 1e3 * float(values.max())
  out["per_replica_compute_ms"] = (1e3 * per_replica["compute_ms"]).tolist()
  out["fraction"] = ((out["allreduce_ms"] + out["straggler_ms"])
                     / max(out["step_ms"], 1e-9))
  return out


class SyncLog:
  """Breakdowns of the logged steps: TensorBoard values and run averages."""

  COMPONENTS = ("input_wait_ms", "compute_ms", "straggler_ms", "allreduce_ms")

  def __init__(self):
    self.breakdowns = []

  def add(self, breakdown_: dict) -> dict:
    """Records one step's breakdown; returns its `sync/*` scalars."""
    self.breakdowns.append(breakdown_)
    values = {f"sync/{k}": v for k, v in breakdown_.items()
              if k != "per_replica_compute_ms"}
    for i, ms in enumerate(breakdown_["per_replica_compute_ms"]):
      values[f"sync_replica/{i}/compute_ms"] = ms
    return values

  def means(self) -> dict:
    """Mean of every component over the recorded steps ({} if none)."""
    if not self.breakdowns:
      return {}
    keys = [*self.COMPONENTS, "step_ms", "fraction"]
    return {k: float(np.mean([b[k] for b in self.breakdowns])) for k in keys}
