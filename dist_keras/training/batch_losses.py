"""Compiled losses that return one number per batch (a function ending in
`tf.reduce_mean`, a keras.losses.Loss whose `call` returns a scalar),
trained at N replicas as on one device.

Keras divides a loss by the replica count under tf.distribute where it
reduces the loss's values per example itself (keras/src/losses/loss.py
reduce_values), so that the replicas' summed gradients are the global
batch's. A value the loss has already reduced passes through undivided:
N replicas would sum N batch means, N times one device's gradient (Keras'
fit under MirroredStrategy trains so), and the eval's loss would be N
times the model's. Such a loss is found at build time from its own `call`
on batches shaped as the run's: a mean over the batch (the same for the
batch repeated twice) is divided by the replicas here, said at the start;
a sum over it (twice as much) needs no division; a value that is neither
is refused at N > 1, since no division makes it one device's.
"""
import numpy as np
import tensorflow as tf

from dist_keras.errors import UserError
from dist_keras.training import keras_internals, whole_batch

# A prediction most losses score above 0 against labels of 0 or 1 (a
# cross-entropy scores labels of 0 as 0: then 1 is tried).
_FILL = 0.25
_LABELS = (0.0, 1.0)
_FIX = ("return one value per example (e.g. tf.reduce_mean(..., axis=-1)) "
        "and let Keras reduce the batch")


def divide_means(model, strategy, met) -> str | None:
  """Divides each compiled loss that returns a mean per batch by the
  replicas (N > 1); returns the line the run says for them, or None.
  `met`: what the model made of a zero batch of the train split
  (contract/probe.py), on which the compiled loss's own losses are called.

  Raises:
    UserError: at N > 1, a loss of one number per batch that is neither a
      mean nor a sum over the batch's examples; a loss that scores the
      batch as a whole (whole_batch.py).
  """
  replicas = strategy.num_replicas_in_sync
  # Not probed: built, compiled with no loss (nor metrics) to divide.
  if replicas == 1 or model.loss is None or met.y_pred is None:
    return None
  with strategy.scope():
    found = keras_internals.compiled_losses(
        model, met.y, met.y_pred, met.sample_weight)
    model.reset_metrics()  # The calls above moved the loss trackers.
  kinds = []
  for index, loss, y_true, y_pred in found:
    kind = _kind(loss, y_true, y_pred)
    if kind is None:
      raise UserError(
          f"the compiled loss {_named(loss)} returns one number per batch, "
          f"which Keras does not divide by the {replicas} replicas, and it "
          "is neither a mean nor a sum over the batch's examples (for a "
          "batch repeated twice it is neither the same nor twice as much), "
          f"so {replicas} replicas cannot train what one device trains; "
          f"{_FIX}.")
    whole_batch.check(loss, _named(loss), kind, (y_true, y_pred), replicas)
    kinds.append((index, loss, kind))
  said = _lines([_named(loss) for _, loss, kind in kinds if kind == "mean"],
                [_named(loss) for _, loss, kind in kinds
                 if kind == "unknown"],  # Neither divided nor refused: said.
                replicas)
  for index, _, kind in kinds:
    if kind == "mean":
      keras_internals.wrap_compiled_loss(model, index, DividedByReplicas)
  return "; ".join(said) or None


def _lines(means: list, unknown: list, replicas: int) -> list[str]:
  """What the run says of the losses divided (`means`) and of those not
  known to be means (`unknown`)."""
  said = []
  if means:
    said.append(
        f"the compiled loss {means[0]} returns one number per batch, its "
        "mean, which Keras does not divide by the replicas (fit under "
        f"MirroredStrategy trains on {replicas} x one device's gradient): "
        f"dist_keras divides it by the {replicas} replicas, so they train "
        "what one device trains (a loss that returns one value per example "
        "is reduced and divided by Keras)")
  if unknown:
    said.append(
        f"the compiled loss {unknown[0]} returns one number per batch, "
        "which Keras does not divide by the replicas, and it was 0 on every "
        "batch dist_keras tried, so whether it is a mean is not known: if "
        f"it is, the {replicas} replicas train on {replicas} x one device's "
        f"gradient; {_FIX}")
  return said


class DividedByReplicas:
  """A loss that returns a mean per batch, divided by the replicas where
  Keras passes it on as it is: with sample weights or an output mask the
  value is spread over the examples, which Keras then reduces and
  divides itself."""

  def __init__(self, loss):
    self.loss = loss

  def __call__(self, y_true, y_pred, sample_weight=None):
    value = self.loss(y_true, y_pred, sample_weight)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if (replicas == 1 or sample_weight is not None
        or getattr(y_pred, "_keras_mask", None) is not None):
      return value
    return value / tf.cast(replicas, value.dtype)


def _kind(loss, y_true, y_pred) -> str | None:
  """'example' (a value per example, which Keras reduces), 'mean' or
  'sum' (one number per batch, the same or twice as much for the batch
  repeated twice), 'unknown' (one number per batch, 0 or not finite for
  every filling tried: a cross-entropy of labels 0 is 0), or None (neither
  a mean nor a sum)."""
  try:
    once = loss.call(*_converted(loss, (y_true, y_pred)))
  except Exception:  # pylint: disable=broad-except
    return "example"  # It fails on the zero batch: left as Keras runs it.
  if once.shape.rank != 0:
    return "example"
  for label in _LABELS:
    try:
      once, twice = (float(_values(loss, y_true, y_pred, copies, label))
                     for copies in (1, 2))
    except Exception:  # pylint: disable=broad-except
      continue  # (Labels of 1 out of a sparse loss's range, say.)
    if once != 0 and np.isfinite([once, twice]).all():
      if np.isclose(twice, once, rtol=1e-5, atol=0):
        return "mean"
      return "sum" if np.isclose(twice, 2 * once, rtol=1e-5, atol=0) else None
  return "unknown"


def _values(loss, y_true, y_pred, copies: int, label: float):
  """The loss's own (unreduced) values for labels of `label` and
  predictions of _FILL, `copies` times the batch's examples."""
  y_true, y_pred = _converted(loss, (y_true, y_pred))
  repeat = lambda t: tf.concat([t] * copies, axis=0)  # pylint: disable=unnecessary-lambda-assignment
  y_true = tf.nest.map_structure(
      lambda t: repeat(tf.fill(tf.shape(t), tf.constant(label, t.dtype))),
      y_true)
  y_pred = tf.nest.map_structure(
      lambda t: repeat(tf.fill(tf.shape(t), tf.constant(_FILL, t.dtype))),
      y_pred)
  return loss.call(y_true, y_pred)


def _converted(loss, tensors):
  """As Loss.__call__ hands them to `call`: in the loss's dtype."""
  return tf.nest.map_structure(
      lambda t: tf.cast(t, loss.dtype), tensors)


def _named(loss) -> str:
  """A function's name for a function (Keras wraps it in a Loss whose
  `fn` it is), else the Loss class's."""
  if callable(getattr(loss, "fn", None)):
    return loss.name
  return type(loss).__name__
