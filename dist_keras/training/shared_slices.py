"""Gradient slices every replica looks up alike (a position Embedding's):
summed slice by slice across the replicas, not gathered.

keras.io's transformer adds `pos_emb(ops.arange(maxlen))` to its token
Embedding: the position lookup has no batch dimension, so one device's
gradient has ONE slice per position, summed over the batch. Gathered
(allreduce.all_reduce_gradients), N replicas handed the optimizer N slices
per position, which Adam, RMSprop and Adagrad square apart (0.0126 off one
device after 12 Adam steps at 2 replicas). Such slices are the same on
every replica and on one device, only their values summed over other
examples: the replicas' values are all-reduced (summed) position by
position, the indices kept, which is one device's gradient exactly, also
where an index repeats, and sends a replica's k slices once instead of
gathering N replicas' slices and indices.

Which slices, at trace time from the graph: the indices must be computed
from constants alone (tf.range / ops.arange of static lengths, constants,
shapes Keras folded into constants), with nothing on their path that reads
a batch, a variable or a random state (a called function, such as
train.jit_compile's compiled pass, walked through), and their count
known. A token Embedding's (its indices are the batch's) stays gathered. A lookup that
repeats per example (tf.fill, broadcast_to or tile to the batch size:
one device's count is N times a replica's) is told apart by the replica's
batch size: an index tensor of the slices' count with a dimension of that
size, or a tile by it, is taken as per example and stays gathered (as is,
rarely, an arange whose length equals the batch size: gathered as before).
Without a known batch (outside a replica step wrapped by knowing_batch)
nothing is summed.
"""
import contextvars
import functools

import numpy as np
import tensorflow as tf

_UNKNOWN = object()
# The replica's batch size while its step is traced (None: dynamic).
_BATCH_SIZE = contextvars.ContextVar("dist_keras_replica_batch_size",
                                     default=_UNKNOWN)
# A walk longer than this reads more than an index computation: not summed.
_MAX_OPS = 256
# Ops that call a function: walked through, into the function's graph.
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def knowing_batch(replica_fn):
  """`replica_fn(batch, ...)`, with the replica's batch size known to
  summed() while it runs (at trace time, in the replica's own thread)."""

  @functools.wraps(replica_fn)
  def run(batch, *args, **kwargs):
    token = _BATCH_SIZE.set(_batch_size(batch))
    try:
      return replica_fn(batch, *args, **kwargs)
    finally:
      _BATCH_SIZE.reset(token)

  return run


def _batch_size(batch):
  """The leading static size of the batch's first tensor, or None."""
  flat = tf.nest.flatten(batch)
  shape = getattr(flat[0], "shape", None) if flat else None
  if shape is None or shape.rank is None or shape.rank == 0:
    return None
  return shape[0]


def summed(grad) -> bool:
  """Whether `grad` is an IndexedSlices every replica (and one device)
  looks up alike: summed position by position in the all-reduce (module
  docstring). False outside a replica step wrapped by knowing_batch."""
  size = _BATCH_SIZE.get()
  if (size is _UNKNOWN or not isinstance(grad, tf.IndexedSlices)
      or tf.executing_eagerly() or grad.indices.shape.rank != 1
      or grad.indices.shape[0] is None):
    return False
  return _constant_indices(grad.indices, grad.indices.shape[0], size)


def _constant_indices(indices, count: int, batch_size) -> bool:
  """Whether `indices` are computed from constants alone, with no index
  tensor of `count` elements shaped by the batch (module docstring)."""
  seen, pending, arguments = set(), [indices], {}
  while pending:
    tensor = pending.pop()
    if tensor.ref() in seen:
      continue
    seen.add(tensor.ref())
    if tensor.ref() in arguments:  # A called function's argument: the
      pending.append(arguments[tensor.ref()])  # caller's tensor.
      continue
    if tensor.op.type in _CALLS:
      called = _called_graph(tensor.op)
      if called is None:
        return False
      arguments.update(zip((t.ref() for t in called.inputs),
                           tensor.op.inputs))
      pending.append(called.outputs[tensor.value_index])
      continue
    if len(seen) > _MAX_OPS or not _pure(tensor.op):
      return False
    if batch_size is not None and _per_example(tensor, count, batch_size):
      return False
    if tensor.op.type != "Rank":  # A rank is static: the input's values
      pending.extend(tensor.op.inputs)  # do not matter.
  return True


def _called_graph(op):
  """The graph of the function `op` calls (train.jit_compile's compiled
  forward and backward pass returns the slices through one), or None.
  TensorFlow has no public lookup of a graph's function by name."""
  try:
    return op.graph._get_function(op.get_attr("f").name).graph  # pylint: disable=protected-access
  except (AttributeError, ValueError, TypeError):
    return None


def _pure(op) -> bool:
  """Whether `op`'s output is a function of its inputs alone, the same on
  every replica: not a placeholder (a batch, a variable's handle), a
  stateful op (an iterator, a variable read) or a random one."""
  if op.type == "Const":
    return True
  return bool(op.inputs) and not op.op_def.is_stateful and (
      "Random" not in op.type)


def _per_example(tensor, count: int, batch_size: int) -> bool:
  """Whether `tensor` looks like an index per example: `count` elements
  with a dimension of the batch size, or a tile by the batch size."""
  shape = tensor.shape
  if (shape.is_fully_defined() and shape.num_elements() == count
      and batch_size in shape.as_list()):
    return True
  if tensor.op.type == "Tile":
    multiples = tf.get_static_value(tensor.op.inputs[1])
    return multiples is None or batch_size in np.ravel(multiples)
  return False
