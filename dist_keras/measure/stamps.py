"""In-graph timestamps of a step's phases (read by breakdown.py).

tf.timestamp() runs when the graph reaches it, not when Python traces it, so
every stamp is tied by control dependencies to what it measures: a stamp
waits for its inputs, and the next phase waits for the stamp.
"""
import tensorflow as tf

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
  A ragged or sparse tensor (a batch's feature, an IndexedSlices gradient)
  counts as its component tensors, which have a device and an element.
  """
  deps = [t for t in tf.nest.flatten(tensors, expand_composites=True)
          if t is not None]
  if clock is None:
    with tf.control_dependencies([_available(t) for t in deps]):
      return tf.timestamp()
  # A data dependency on one element of each tensor: control dependencies
  # of a function call do not survive its inlining.
  firsts = _firsts_as_numbers(deps)
  return _timestamp_reading(clock.handle,
                            tf.concat([*firsts, tf.zeros([1], tf.float64)], 0))


def _firsts_as_numbers(tensors) -> list:
  """Each tensor's first element (none if empty) as float64; a string's
  length. A string has no cast: TF's graph optimizer had removed the cast
  (it feeds a control dependency only), so a text batch trained only while
  it ran. Raw ops on constants made once: a step of a model with hundreds
  of variables stamps ~3 tensors per variable, and tf.reshape and `t[:1]`
  each build their own constants through Python wrappers (586 tensors: 1.4
  s of a trace, 0.5 s so)."""
  flat, zero, one = tf.constant([-1]), tf.constant([0]), tf.constant([1])
  firsts = []
  for t in tensors:
    first = tf.raw_ops.StridedSlice(
        input=tf.raw_ops.Reshape(tensor=t, shape=flat), begin=zero, end=one,
        strides=one)
    if first.dtype == tf.string:
      first = tf.raw_ops.StringLength(input=first)
    firsts.append(tf.cast(first, tf.float64))
  return firsts


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
        lambda t: None if t is None else tf.identity(t), tensors,
        expand_composites=True)


# Per-replica stamps, in this order: inputs in hand, gradients computed,
# gradients all-reduced, update applied.
STAMPS = ("start", "grads_ready", "reduced", "end")
# The figures of a replica's durations_row.
DURATIONS = 5


def durations_row(start, grads_ready, reduced, end, step_start, host):
  """A replica's (time in the reduction, compute, input wait, host time
  outside the calls, of which in the users' callbacks): [1, DURATIONS]
  seconds, in replica context, for rows_gatherer to hand the chief, so it
  can tell which worker is slow, and at what.

  Durations, not times of day, so they compare across hosts whose clocks
  differ; taken after the step's last stamp so they time nothing
  themselves. Compute is breakdown.split_step's: until the gradients, plus
  the update after the reduction. The input wait runs from the worker's
  `step_start` to the replica's own start; `host` is its worker's
  meters.RunMeters.host_figures (per step, seconds: the same on its
  replicas).
  """
  durations = tf.concat([tf.stack([reduced - grads_ready,
                                   (grads_ready - start) + (end - reduced),
                                   start - step_start]),
                         tf.cast(tf.reshape(host, [2]), tf.float64)], 0)
  return after_stamp(end, tf.reshape(durations, [1, DURATIONS]))


def local_replicas(strategy) -> int:
  """The replicas of this worker: the rows of its timed steps' stamps."""
  return len(strategy.extended.worker_devices)


def rows_gatherer(strategy):
  """A tf.function `(rows) -> [replicas in sync, DURATIONS]`: this
  worker's replicas' durations_row (`rows`, in their local order) and every
  other worker's, in TF's replica order (the chief's, or worker 0's,
  first), on every worker. A collective of its own, apart from the step,
  so that only the timed calls pay it, and every worker calls it after the
  same ones."""
  local = local_replicas(strategy)

  def gather(rows):
    replica = tf.distribute.get_replica_context()
    # A worker's replicas are numbered on from the workers' before it.
    own = tf.gather(rows, [replica.replica_id_in_sync_group % local])
    return replica.all_gather(own, axis=0)

  @tf.function(autograph=False)
  def gathered(rows):
    return strategy.experimental_local_results(
        strategy.run(gather, args=(rows,)))[0]

  return gathered
