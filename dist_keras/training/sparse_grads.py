"""An Embedding's gradient under a global-norm clip: each replica sums its
slices into the dense table, and the table is all-reduced like any dense
gradient (not gathered), where that sends fewer bytes.

An Embedding's gradient is a tf.IndexedSlices, a slice per looked-up token.
With the optimizer's `global_clipnorm`, Keras' clip (`clip_by_global_norm`,
keras/src/optimizers/base_optimizer.py) counts in the norm the square of
every slice (not of the table's summed rows) and multiplies the slices by
the scale, which densifies them: the optimizer is handed the dense table,
never the slices. Gathered (allreduce.all_reduce_gradients), every
replica's slices went to every replica to be summed there, after a gather
of their counts and a tf.cond (12,800 slices of the default LSTM on 2
replicas). Here each replica sums its own slices into the table and their
squares into one number; one all-reduce carries the dense gradients, the
tables and that number; the clip is Keras', with the norm one device takes
from the same slices, and the optimizer's own clip is off meanwhile
(keras_internals.clipping_done). Exact against one device up to the order
of float sums (test_fit_parity.py).

Which path, per Embedding: its table is V x d floats whatever the batch,
its slices k a replica (one per looked-up token) of d floats and an index
each. A large vocabulary's table sends far more than its slices (200k x
64, 640 slices a replica: 51 MB a step against 166 KB, 3-5x slower on 2
workers), so each Embedding takes, from static shapes at trace time, the
path that sends fewer bytes: the ring all-reduce of its table or the ring
all-gather of every replica's slices, as measure/costmodel.py models them.
With k unknown at trace time (a dynamic shape) it is gathered. The
variables of both paths in one step are clipped with one norm: a gathered
Embedding's squares are taken after the gather, from every replica's
slices (one device's), and its slices densified by the scale, as Keras'
clip does.

Everything else keeps the gather, where the optimizer is handed the slices
or the table would change what it computes: no clip, `clipnorm` or
`clipvalue` (Keras clips each slice and keeps them as slices; Adam squares
each before a repeated token's add up), a LossScaleOptimizer, gradient
accumulation, a `loss_scale_factor` (Keras unscales before the clip), a
variable Keras overwrites with its gradient (left out of Keras' norm), an
optimizer class with its own `_clip_gradients`, a compressed all-reduce
(the table would be summed in 16 bits, the squares could overflow
float16), a gradient not in float32, one replica (no all-reduce), and a
model's own train_step (its optimizer's `apply` reduces: model_step.py).
"""
import math

import keras
import tensorflow as tf

from dist_keras.measure import costmodel
from dist_keras.training import allreduce, keras_internals, shared_slices


def table_form(optimizer, variables, grads, allreduce_dtype: str):
  """The Tables a replica's `grads` (as_reduced's) are all-reduced as, or
  None where they go as they are (call in replica, at trace time; when:
  the module docstring)."""
  sparse = tuple(isinstance(g, tf.IndexedSlices) for g in grads)
  context = tf.distribute.get_replica_context()
  if (not any(sparse) or context is None
      or context.num_replicas_in_sync == 1 or allreduce_dtype != "float32"
      or any(g.dtype != tf.float32 for g in grads if g is not None)
      or not _clips_by_global_norm_alone(optimizer)
      or any(getattr(v, "overwrite_with_gradient", False)
             for v in variables)):
    return None
  replicas = context.num_replicas_in_sync
  # Slices every replica looks up alike are summed slice by slice in the
  # all-reduce (shared_slices.py): their squares, taken after it, are one
  # device's; a replica's table would count its own.
  summed = tuple(
      is_sparse and not shared_slices.summed(g)
      and table_sends_less(g, v, replicas)
      for g, v, is_sparse in zip(grads, variables, sparse))
  if not any(summed):
    return None
  return Tables(summed, float(optimizer.global_clipnorm))


def table_sends_less(slices, variable, replicas: int) -> bool:
  """Whether all-reducing `variable`'s table sends no more bytes than
  all-gathering `slices` (a replica's IndexedSlices) from `replicas`
  replicas; False when their count is unknown at trace time. A tie takes
  the table: one collective, where the gather also gathers the counts."""
  count, row = slices.indices.shape[0], slices.values.shape[1:]
  if count is None or not row.is_fully_defined():
    return False
  table = math.prod(variable.shape) * slices.values.dtype.size
  gathered = count * (math.prod(row) * slices.values.dtype.size
                      + slices.indices.dtype.size)
  # No latency and a byte a second: the model's seconds are the bytes one
  # replica sends (the all-reduce ~2(n-1)/n of the table, the all-gather
  # n-1 replicas' slices).
  return (costmodel.allreduce_seconds(replicas, table, 0.0, 1.0)
          <= costmodel.allgather_seconds(replicas, gathered, 0.0, 1.0))


def _clips_by_global_norm_alone(optimizer) -> bool:
  """Whether Keras' update clips the reduced gradients by their global
  norm, first and with nothing before it that the table would change."""
  if (isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
      or not keras_internals.clips_as_keras(optimizer)):
    return False
  clip = optimizer.global_clipnorm
  return bool(clip and clip > 0 and not (optimizer.clipnorm
                                        and optimizer.clipnorm > 0)
              and not optimizer.gradient_accumulation_steps
              and optimizer.loss_scale_factor is None)


class Tables:
  """One step's IndexedSlices as tables (those `summed` says), the others
  kept to be gathered: `local` before the all-reduce, `apply` after it."""

  def __init__(self, summed: tuple, clip_norm: float):
    self.summed = summed  # Which gradients go as their tables.
    self.clip_norm = clip_norm

  def local(self, grads) -> list:
    """`grads` with each summed IndexedSlices as its dense table (a
    repeated token's slices added up), then one more tensor: the sum of
    their slices' squares. The tables and dense gradients are all-reduced
    (summed), the other IndexedSlices gathered."""
    squares = [tf.reduce_sum(tf.square(g.values))
               for g, summed in zip(grads, self.summed) if summed]
    tables = [tf.convert_to_tensor(g) if summed else g
              for g, summed in zip(grads, self.summed)]
    return tables + [tf.add_n(squares)]

  def apply(self, optimizer, variables, reduced):
    """Clips the all-reduced `reduced` (local's form) as Keras would have
    clipped the slices and applies them with the optimizer's own clip off;
    returns whether they were finite before the clip (steps._update_fn)."""
    grads, slice_squares = reduced[:-1], reduced[-1]
    finite = allreduce.all_finite(grads)
    clipped = self.clip_by_global_norm(grads, slice_squares)
    with keras_internals.clipping_done(optimizer):
      optimizer.apply_gradients(zip(clipped, variables))
    return finite

  def clip_by_global_norm(self, grads, slice_squares) -> list:
    """Keras' clip_by_global_norm, finite-scale trick included: a norm
    that is inf or NaN makes every gradient NaN. The summed slices' part
    of the squared norm is `slice_squares`, their tables' own is not
    counted; a gathered IndexedSlices counts its slices' squares and is
    densified by the scale, as Keras' clip does."""
    squares = [tf.reduce_sum(tf.square(getattr(g, "values", g)))
               for g, summed in zip(grads, self.summed)
               if g is not None and not summed]
    use_norm = tf.sqrt(tf.reduce_sum(tf.stack(squares + [slice_squares])))
    scale_for_finite = self.clip_norm * tf.minimum(
        1.0 / use_norm, 1.0 / self.clip_norm)
    scale = scale_for_finite + (use_norm - use_norm)
    return [tf.convert_to_tensor(g) * scale if g is not None else None
            for g in grads]
