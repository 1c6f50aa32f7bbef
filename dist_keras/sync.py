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


def all_reduce_gradients(grads):
  """SUM-all-reduces per-replica gradients across replicas (call in replica).

  Each replica's loss is already divided by the GLOBAL batch size, so the sum
  is the gradient of the global mean loss. Embedding gradients arrive as
  IndexedSlices; they are densified so one packed all-reduce carries all.
  """
  dense = [tf.convert_to_tensor(g) if g is not None else None for g in grads]
  ctx = tf.distribute.get_replica_context()
  present = [g for g in dense if g is not None]
  reduced = iter(ctx.all_reduce(tf.distribute.ReduceOp.SUM, present))
  return [next(reduced) if g is not None else None for g in dense]


def gradient_bytes(variables) -> int:
  """Bytes one replica sends into the all-reduce: every trainable variable."""
  return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize
             for v in variables)
