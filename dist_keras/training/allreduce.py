"""Gradient synchronisation: one explicit all-reduce per step.

(The in-graph timing of it lives in dist_keras/measure: stamps.py, breakdown.py.)

Keras 3 optimizers SUM-all-reduce gradients inside `apply_gradients`, and
clip them BEFORE that reduction, i.e. per replica. dist_keras reduces
gradients itself instead, so that clipping sees the global gradient and the
all-reduce can be timed, and turns the optimizer's own reduction off
(keras_internals.disable_optimizer_allreduce).

An Embedding's gradient is a tf.IndexedSlices, one slice per looked-up
token. Unclipped (or clipped per variable or per value: Keras keeps the
slices) it reaches the optimizer as one, as under Keras' fit on one
device: Adam, RMSprop and Adagrad square each slice before a repeated
token's slices add up, so the summed (dense) gradient trains other weights
(0.065 apart after 10 unclipped Adam steps of a 20-token Embedding,
2026-12-05); here the replicas' slices are gathered. Under a global-norm
clip (global_clipnorm, the built-in models' default) Keras' clip densifies
the slices before the optimizer sees them, so each replica sums its own
into the dense table, all-reduced with the dense gradients, where the
table sends fewer bytes than the slices (sparse_grads.py). Keras' own fit
under MirroredStrategy clips each replica's gradients by that replica's
own norm, which is not one device's.

A sparse input's Dense kernel (Keras multiplies a tf.SparseTensor by it
with tf.nn.embedding_lookup_sparse, which looks up each DISTINCT column
once: tf.unique) gets one slice per column present, summed over the
batch: on one device Adam squares each column's sum. Gathered, a column
present in two replicas' batches came twice, and Adam summed the two
halves' squares (0.029 apart after 12 Adam steps at 2 replicas; RMSprop,
Adagrad and clipnorm alike); such slices are summed by column after the
gather (merge_duplicates), as one device's.

A position Embedding's lookup (`pos_emb(ops.arange(maxlen))`) has no
batch dimension: one slice per position, summed over the batch, the same
indices on every replica; its values are all-reduced position by position
instead of gathered (shared_slices.py).
"""
import hashlib
import json
import math
import weakref

import numpy as np
import tensorflow as tf

from dist_keras.distribute import leaving
from dist_keras.errors import UserError
from dist_keras.training import shared_slices


def dense_gradients(grads):
  """Gradients as dense tensors: an IndexedSlices' repeated rows summed (a
  scatter-add over every looked-up token)."""
  return [tf.convert_to_tensor(g) if g is not None else None for g in grads]


def as_reduced(grads):
  """A replica's gradients in the form the all-reduce and the optimizer
  take (call in replica): IndexedSlices kept, but densified on a TPU.

  A TPU's all-reduce (cross_replica_sum) takes dense tensors only, so
  TensorFlow would densify them there anyway; densified here, the scatter
  is timed as compute, not all-reduce. There Adam, RMSprop and Adagrad
  train an Embedding other than fit on one device (module docstring).
  """
  if isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy):
    return dense_gradients(grads)
  return list(grads)


def all_reduce_gradients(grads, dtype: str = "float32",
                         bytes_per_pack: int = 0):
  """SUM-all-reduces per-replica gradients across replicas (call in replica).

  Each replica's loss is already divided by the GLOBAL batch size, so the sum
  is the gradient of the global mean loss. An IndexedSlices stays one:
  TensorFlow's all-reduce of it concatenates the replicas' slices (an
  all-gather), so the optimizer sees the slices one device's would (in one
  device's order when replica r reads the r-th part of its batch). Under a
  global-norm clip the step hands it the summed table instead where that
  sends fewer bytes (sparse_grads.Tables.local). Slices of distinct
  indices (distinct_slices) are summed by index after the gather; slices
  every replica looks up alike (a position Embedding's:
  shared_slices.summed) are not gathered: their values are all-reduced
  like a dense gradient, slice by slice, and keep their indices.

  A 16-bit `dtype` compresses the all-reduce (Horovod's fp16 compression):
  dense gradients are cast for the collective and the sums cast back,
  halving the bytes sent at the price of summing in 16 bits (float16: 3
  decimal digits, overflow above 65504; bfloat16: 2-3 digits, float32's
  range; a shared IndexedSlices' values too). A gathered IndexedSlices is
  gathered in its own dtype: TensorFlow's collective all-gather has no
  bfloat16 kernel, and nothing sums its slices in the collective, so 16
  bits would only round them. `bytes_per_pack` > 0
  splits the collective into packs of about that many bytes (per call, so
  it overrides the strategy's CommunicationOptions; TF's collective
  implementations use it: MultiWorkerMirroredStrategy, not Mirrored on CPUs,
  which reduces to one device); each IndexedSlices is gathered on its own.
  """
  ctx = tf.distribute.get_replica_context()
  present = [g for g in grads if g is not None]
  if not present:  # (Every layer frozen.) TF's all_reduce needs a value.
    return list(grads)
  shared = [shared_slices.summed(g) for g in present]
  # Slices every replica looks up alike: their values summed as dense.
  sent = [g.values if summed else g for g, summed in zip(present, shared)]
  sent = [g if dtype == "float32" or isinstance(g, tf.IndexedSlices)
          else tf.cast(g, dtype) for g in sent]
  options = tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=bytes_per_pack)
  reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, sent, options)
  reduced = iter([_restored(r, g, summed)
                  for r, g, summed in zip(reduced, present, shared)])
  return [next(reduced) if g is not None else None for g in grads]


def _restored(reduced, grad, summed: bool):
  """A gradient as the optimizer takes it back from the all-reduce: a
  shared IndexedSlices' summed values with its own indices, distinct
  slices summed by index, the rest in the gradient's dtype."""
  if summed:
    return tf.IndexedSlices(tf.cast(reduced, grad.dtype), grad.indices,
                            grad.dense_shape)
  if distinct_slices(grad):
    return merge_duplicates(tf.cast(reduced, grad.dtype))
  return tf.cast(reduced, grad.dtype)


# Ops that pass their first input's values on unchanged (in another shape
# or integer type): what lies between a tf.unique and the slices' indices.
_PASSING = frozenset({"Reshape", "Identity", "Cast", "ExpandDims",
                      "Squeeze"})
_UNIQUE = frozenset({"Unique", "UniqueV2", "UniqueWithCounts",
                     "UniqueWithCountsV2"})


def distinct_slices(grad) -> bool:
  """Whether `grad` is an IndexedSlices whose indices are a tf.unique's
  (at trace time, from the graph): one slice per distinct index, each
  summed over the replica's batch, as tf.nn.embedding_lookup_sparse (a
  sparse input's Dense kernel) makes them. One device's are then distinct
  over the whole batch. An Embedding's (a slice per looked-up token,
  repeats kept, as one device's) are not. A tf.unique's count is never
  known at trace time, so such slices are always gathered, never summed
  into a table (sparse_grads.table_sends_less), and run one step a call
  (varying_slices.py)."""
  if not isinstance(grad, tf.IndexedSlices) or tf.executing_eagerly():
    return False
  tensor = grad.indices
  while tensor.op.type in _PASSING:
    tensor = tensor.op.inputs[0]
  return tensor.op.type in _UNIQUE and tensor.value_index == 0


def merge_duplicates(slices):
  """`slices` (gathered from every replica) with the slices of one index
  summed into one, in the order each index first comes (one device's, when
  replica r reads the r-th part of its batch)."""
  indices, position = tf.unique(slices.indices)
  values = tf.math.unsorted_segment_sum(slices.values, position,
                                        tf.shape(indices)[0])
  return tf.IndexedSlices(values, indices, slices.dense_shape)


def all_finite(grads):
  """Whether every gradient value is finite: the check Keras'
  LossScaleOptimizer makes to apply or skip an update, and what tells the
  host the gradients diverged. An IndexedSlices' slices are read as they
  are (summing a token's slices first, as a global norm would, cost ~1 ms
  of a 28 ms Mirrored LSTM step, 2026-12-05, for a number only a
  divergence line printed)."""
  parts = [g.values if isinstance(g, tf.IndexedSlices) else g
           for g in grads if g is not None]
  return tf.reduce_all(tf.stack(
      [tf.reduce_all(tf.math.is_finite(p)) for p in parts] or [True]))


def host_value_sum(strategy):
  """`(float) -> its sum over every replica of the job`.

  For the host to agree with the other workers on a number (a resume step,
  a stop request): each replica contributes this process's value. One
  tf.function per strategy, traced once: a new one per use retraced at
  every epoch's agreement, and TensorFlow warned of retracing.
  """
  total = _TOTALS.get(strategy)
  if total is None:
    total = _TOTALS[strategy] = _total_over_replicas(weakref.ref(strategy))
  return lambda value: float(total(tf.constant(value, tf.float64)))


def host_vector_sum(strategy):
  """`(float64 vector) -> its sum over every replica of the job`, as
  host_value_sum; the vector's length may change from call to call (the
  same on every worker at each), traced once."""
  total = _VECTOR_TOTALS.get(strategy)
  if total is None:
    total = _VECTOR_TOTALS[strategy] = _total_over_replicas(
        weakref.ref(strategy), [tf.TensorSpec([None], tf.float64)])
  return lambda values: total(tf.constant(values, tf.float64)).numpy()


# The value holds only a weak reference: the strategy can still go away.
_TOTALS = weakref.WeakKeyDictionary()
_VECTOR_TOTALS = weakref.WeakKeyDictionary()


def _total_over_replicas(strategy_ref, signature=None):
  # Eager collectives under MWMS are slow and warn.
  @tf.function(input_signature=signature)
  def total(value):
    strategy = strategy_ref()
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
        lambda: tf.identity(value)), axis=None)

  return total


def any_worker(strategy):
  """`(bool) -> bool`: whether this or any other worker says so (a
  collective: every worker calls it at the same point)."""
  total = host_value_sum(strategy)
  return lambda flag: total(float(flag)) > 0


def every_worker(strategy):
  """`(bool) -> bool`: whether this and every other worker say so (a
  collective: every worker calls it at the same point)."""
  total = host_value_sum(strategy)
  return lambda flag: total(float(flag)) == strategy.num_replicas_in_sync


def check_same_config(strategy, config_dict: dict) -> None:
  """Refuses workers started with different configs, before the model's
  variables meet in a collective (a model size that differs failed there
  with a shape error on one worker and a lost peer, exit 200, on the
  other; other keys trained on). One sum of a 32-bit digest of the config
  (data.data_dir left out: each host's own); a worker whose digest is the
  mean of the others' would miss it, a chance of 1 in 2**32."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return  # One process: one config.
  shared = {**config_dict, "data": {
      k: v for k, v in config_dict["data"].items() if k != "data_dir"}}
  text = json.dumps(shared, sort_keys=True, default=str).encode()
  digest = int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(),
                          "big")
  total = host_value_sum(strategy)(float(digest))
  if total != float(digest) * strategy.num_replicas_in_sync:
    # Every worker sees the same sum.
    raise leaving.refused_together(UserError(
        f"the workers were started with different configs (this worker's "
        f"digest {digest:08x}); start every worker with the same --config, "
        "overrides and config file."))


def gradient_bytes(variables, allreduce_dtype: str = "float32") -> int:
  """Bytes one replica would all-reduce if every trainable variable's
  gradient were dense, in float32 or the 16-bit `allreduce_dtype`: the
  count before a timed step has run (sent_bytes, from the gradients
  themselves, replaces it)."""
  itemsize = (None if allreduce_dtype == "float32"
              else tf.as_dtype(allreduce_dtype).size)
  return sum(math.prod(v.shape) * (itemsize or np.dtype(v.dtype).itemsize)
             for v in variables)


def sent_bytes(grads, allreduce_dtype: str = "float32"):
  """An int64 [all-reduced, gathered] pair: the bytes one replica sends of
  `grads` (as_reduced's) in all_reduce_gradients. Dense gradients count in
  the dtype they are reduced in (an Embedding's table summed under a
  global-norm clip among them, and the sum of its slices' squares:
  sparse_grads.py, and the values of slices every replica looks up alike:
  shared_slices.py); an IndexedSlices' values and indices, as gathered, at
  this step's number of slices (a tensor: a dynamic batch shape is counted
  too)."""
  dense, gathered = [], []
  for g in grads:
    if shared_slices.summed(g):
      g = g.values  # All-reduced as a dense gradient.
    if isinstance(g, tf.IndexedSlices):
      gathered += [_bytes(g.values, g.values.dtype),
                   _bytes(g.indices, g.indices.dtype)]
    elif g is not None:
      dense.append(_bytes(g, g.dtype if allreduce_dtype == "float32"
                          else tf.as_dtype(allreduce_dtype)))
  return tf.stack([_total(dense), _total(gathered)])


def _bytes(tensor, dtype):
  """An int where `tensor`'s shape is known when traced (3 ops a gradient
  cost a 194-gradient trace ~0.3 s), else an int64 tensor."""
  if tensor.shape.is_fully_defined():
    return tensor.shape.num_elements() * tf.as_dtype(dtype).size
  return tf.size(tensor, out_type=tf.int64) * tf.as_dtype(dtype).size


def _total(counts: list) -> tf.Tensor:  # Python ints and int64 tensors.
  known = tf.constant(sum(c for c in counts if isinstance(c, int)), tf.int64)
  return tf.add_n([known, *(c for c in counts if not isinstance(c, int))])
