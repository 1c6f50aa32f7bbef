"""Compiled losses that score a batch as a whole, refused at N > 1 replicas.

dist_keras (with Keras) makes the replicas' losses add up to one device's
on the global batch by dividing each replica's mean by the replicas
(batch_losses.py; Keras' own reduction). That holds for a loss that is a
mean (or a sum) of values each example has alone: for two equal halves a
and b of a batch, L(a + b) = (L(a) + L(b)) / 2 (or L(a) + L(b)). A loss
over the batch as a whole (keras.losses.Dice and Tversky with their
default axis=None: one ratio over every example; Circle, or a contrastive
loss over the batch's pairs: each example's value depends on the others)
breaks it: each replica scores only its part, and no division gives one
device's value or gradient. Found at build time by calling the loss on
two halves and on them together (labels 0 in one half, 1 in the other;
predictions drawn in (0.1, 0.9), each element its own), where every loss
of values per example meets the relation to rounding.
"""
import numpy as np
import tensorflow as tf

from dist_keras import installation
from dist_keras.errors import UserError

# Examples per half: two, so that a loss over the batch's pairs (Circle's
# of one label and of two) has both kinds of pair in the halves together.
# (Eight examples' predictions at once, fewer than a step's batch holds.)
_PER_HALF = 2
# Labels of the halves, tried in turn: 0 and 1 (a ratio of overlaps, as
# Dice's, needs some 1s), then 0 and 0 (a sparse loss of one class).
_LABELS = ((0.0, 1.0), (0.0, 0.0))
_RTOL, _ATOL = 1e-4, 1e-6  # Rounding of a mean over 2 or 4 examples.
_AXIS_LOSSES = ("Dice", "Tversky")  # Keras' losses with an `axis=None`.


def check(loss, name: str, kind: str, met_tensors, replicas: int) -> None:
  """Refuses a loss that scores the batch as a whole, at `replicas` > 1.

  Args:
    loss: a keras.losses.Loss of the compiled loss.
    name: how the run names it.
    kind: batch_losses' kind of it: 'example' (values Keras reduces),
      'mean', 'sum' or 'unknown' (one number per batch).
    met_tensors: (y_true, y_pred) the compiled loss hands it for the zero
      batch of the train split (their shapes and dtypes are used).
    replicas: the replica count.

  Raises:
    UserError: its value for two halves together is not their mean (or
      sum, as the loss adds up).
  """
  if replicas <= 1:
    return
  # On the host: eight examples' predictions (an LM's logits: ~200 MB an
  # example at 1,024 tokens of 50k) beside the model on an accelerator.
  with tf.device("/cpu:0"):
    found = _halves(loss, *met_tensors)
  if found is None:
    return  # Fails on such batches, or not finite: left as Keras runs it.
  together, apart = found
  if kind == "example":  # Keras reduces it: as the loss's reduction says.
    kind = "sum" if getattr(loss, "reduction", None) == "sum" else "mean"
  relations = {"mean": [sum(apart) / 2], "sum": [sum(apart)],
               "unknown": [sum(apart) / 2, sum(apart)]}[kind]
  if any(np.isclose(together, r, rtol=_RTOL, atol=_ATOL) for r in relations):
    return
  raise UserError(
      f"the compiled loss {name} scores the batch as a whole, not as the "
      f"{'sum' if kind == 'sum' else 'mean'} of its examples' values (two "
      f"halves of a batch score {together:.4g} together, {apart[0]:.4g} and"
      f" {apart[1]:.4g} apart), so {replicas} replicas, each scoring its "
      "own part of the batch, cannot train what one device trains; "
      f"{_fix(loss, *met_tensors)}, or train on one replica "
      "(runtime.strategy=one_device); " + installation.see_docs(
          "own_models.md", "what is refused",
          "Python API: your own model and data") + ".")


def _fix(loss, y_true, y_pred) -> str:
  """The change that makes the loss one of values per example."""
  klass = type(loss).__name__
  rank = len(getattr(y_pred, "shape", ()))
  if (klass in _AXIS_LOSSES and getattr(loss, "axis", 0) is None
      and rank > 1):
    axes = tuple(range(1, rank))
    return (f"compile keras.losses.{klass}(axis={axes}) to score each "
            "example over its own elements (Keras then averages them)")
  try:  # The shapes of its `call`'s values for a half and for both.
    with tf.device("/cpu:0"):
      a, b = (_half(y_true, y_pred, label, seed, loss.dtype)
              for seed, label in enumerate(_LABELS[0]))
      half, both = (tuple(loss.call(*batch).shape)
                    for batch in (a, _joined(a, b)))
  except Exception:  # pylint: disable=broad-except
    half = both = (0,)
  if not both:
    return ("return one value per example (each from that example's "
            "labels and prediction alone) and let Keras reduce the batch")
  if len(both) > 1 and both[1] == 2 * half[1] == 2 * _PER_HALF:
    return (f"its values have a row for every pair of examples ({both} "
            f"for {both[0]} examples; labels of shape {_shape(y_true)} "
            "broadcast against predictions of shape "
            f"{_shape(y_pred)}?): give each example one value (labels of "
            "shape [batch], say)")
  return ("each example's value depends on the batch's other examples, "
          "which a replica does not see: compute each from its own "
          "labels and prediction")


def _shape(t) -> str:
  """[batch, d1, ...] for a tensor of the zero batch."""
  return "[" + ", ".join(["batch"] + [str(d) for d in t.shape[1:]]) + "]"


def _halves(loss, y_true, y_pred):
  """(the loss of two halves together, [of each half]) for the first
  labels of _LABELS the loss takes with finite values; None if none."""
  for labels in _LABELS:
    try:
      a, b = (_half(y_true, y_pred, label, seed, loss.dtype)
              for seed, label in enumerate(labels))
      values = [float(loss(*batch)) for batch in (_joined(a, b), a, b)]
    except Exception:  # pylint: disable=broad-except
      continue  # (Labels of 1 out of a sparse loss's range, say.)
    if np.isfinite(values).all():
      return values[0], values[1:]
  return None


def _half(y_true, y_pred, label: float, seed: int, dtype):
  """(labels, predictions) of _PER_HALF examples shaped like y_true,
  y_pred, in `dtype` (as Loss.__call__ hands them to `call`): labels
  `label`, predictions drawn in (0.1, 0.9) with `seed`, each element its
  own (drawn in float32: an LM's logits are large)."""

  def shape(t):
    return [_PER_HALF] + list(t.shape[1:])

  return (
      tf.nest.map_structure(
          lambda t: tf.fill(shape(t), tf.constant(label, dtype)), y_true),
      tf.nest.map_structure(
          lambda t: tf.cast(tf.random.stateless_uniform(
              shape(t), (seed, 0), 0.1, 0.9), dtype), y_pred))


def _joined(a, b):
  """The batch of half `a`'s examples, then half `b`'s."""
  return tf.nest.map_structure(lambda s, t: tf.concat([s, t], 0), a, b)
