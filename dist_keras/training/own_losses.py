"""The model's own losses (`self.add_loss(...)` in a layer's call) that
sum over the batch, refused at N > 1 replicas before training.

Keras divides each of the model's own losses by the replica count under
tf.distribute (its TF trainer's `_aggregate_additional_loss`), so that
the replicas' summed gradients are one device's for a mean over a
replica's batch. A sum over it is divided once too many: N replicas
train on 1/N of it (at 2 replicas, weights 0.0128 off one device after
12 SGD steps; 0.058 for a sum divided by the global batch size, keras.io's
habit), as fit under MirroredStrategy trains it. Correcting it (x N)
would mean finding that term among the model's losses at every step (a
layer may add one conditionally, or call twice), so it is refused, with
the fix: a mean over the replica's batch.

Found as batch_losses.py tells a compiled loss's mean from its sum: each
own loss for a batch and for it repeated twice, the same for a mean,
twice as much for a sum. Called in inference (training=False: no Dropout
noise) where that holds the losses of the training call, else in
training; either way in one tf.function whose updates of the model's
variables are undone (Keras' layers update their metrics, reset after).
Weight regularisers (and Keras' activity regularisers, a mean over the
batch) do not double and pass.
"""
import keras
import numpy as np
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract import batches, model_calls
from dist_keras.errors import UserError
from dist_keras.training import state_updates

# A sum over the batch doubles exactly in inference; in training (Dropout
# drawing the copy's own masks) to a few percent. A mean stays.
_RTOL = 0.1


def check(model, strategy, batch_spec, forward) -> None:
  """Refuses an own loss of the model that sums over the batch, at N > 1.

  Args:
    model: the built, compiled model.
    strategy: the run's strategy.
    batch_spec: the train split's element spec (a replica's batches).
    forward: state_updates.traced's Forward (None: nothing to look at).

  Raises:
    UserError: an own loss twice as much for the batch repeated twice.
  """
  replicas = strategy.num_replicas_in_sync
  regularised = sum(1 for w in model.weights
                    if getattr(w, "regularizer", None) is not None)
  if forward is None or forward.losses <= regularised:
    return  # Nothing but weight regularisers: none scales with the batch.
  x, _, _ = keras.utils.unpack_x_y_sample_weight(
      model_calls.shaped_by_inputs(model, batch_spec))
  try:
    found = _doubled(model, strategy, x, forward.losses)
  except Exception:  # pylint: disable=broad-except
    return  # Fails on such batches (a fixed batch size): as Keras runs it.
  if found is None:
    return
  holder, once, twice = found
  raise UserError(
      f"the own loss of {holder} (add_loss in its call) sums over the "
      "batch (a "
      f"batch repeated twice gives {twice:.4g}, not {once:.4g}), and Keras "
      f"divides every loss of the model's own by the {replicas} replicas "
      f"under tf.distribute, so {replicas} replicas would train on 1/"
      f"{replicas} of it; add a mean over the replica's batch (ops.mean "
      "instead of ops.sum, with no division by the global batch size), or"
      " train on one replica (runtime.strategy=one_device); "
      + installation.see_docs("own_models.md", "what is refused",
                              "Python API: your own model and data") + ".")


def _doubled(model, strategy, x_spec, count: int):
  """(the name of the layer that adds it, its value for a batch, for the
  batch repeated twice) of the first own loss that doubles, or None."""
  x = _filled(x_spec)
  twice_x = tf.nest.map_structure(lambda t: tf.concat([t, t], 0), x)
  for training in (False, True):
    with strategy.scope():
      values = _values(model, x, twice_x, training)
    if values is not None and len(values[0]) == count:
      break
  if values is None or len(values[0]) != count:
    return None
  (once, twice), holders = values[:2], values[2]
  for index, (a, b) in enumerate(zip(once, twice)):
    a, b = float(a), float(b)
    if (a != 0 and np.isfinite([a, b]).all()
        and np.isclose(b, 2 * a, rtol=_RTOL, atol=0)):
      return holders[index], a, b
  return None


def _values(model, x, twice_x, training: bool):
  """([model.losses' values for x], [for twice_x], [who adds each]) from
  a call in one tf.function, every variable it assigns put back after;
  None if the call fails."""
  holders = []

  def losses(x):
    model_calls.traced_forward(model, x, training)
    found = list(model.losses)
    holders[:] = [_holder(model, t) for t in found]
    return found

  spec = tf.nest.map_structure(
      lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), x)
  try:
    with installation.keras_name_scopes_kept():
      function = tf.function(losses, autograph=False).get_concrete_function(
          spec)
  except Exception:  # pylint: disable=broad-except
    return None
  assigned = state_updates.assigned_in(function.graph, model.variables)
  kept = [(a.variable, a.variable.numpy()) for a in assigned]
  try:
    return ([t.numpy() for t in function(x)],
            [t.numpy() for t in function(twice_x)], holders)
  finally:
    for variable, value in kept:
      variable.assign(value)
    model.reset_metrics()


def _holder(model, term) -> str:
  """'layer NAME' of the innermost layer whose losses hold `term` (the
  model's own for the model)."""
  holders = [layer for layer in installation.layers_in(model,
                                                       include_self=True)
             if any(t is term for t in layer.losses)]
  if not holders:
    return f"model {model.name!r}"
  # The innermost: the fewest losses, the last (deepest) of equals.
  inner = min(reversed(holders), key=lambda layer: len(layer.losses))
  return f"layer {inner.name!r}"


def _filled(x_spec):
  """One example shaped like `x_spec`: floats drawn in (0.1, 0.9) (zeros
  give many a penalty of 0), other dtypes zeros (a token id of 0)."""
  zeros = batches.zeros(x_spec)

  def fill(t):
    if isinstance(t, tf.Tensor) and t.dtype.is_floating:
      return tf.cast(tf.random.stateless_uniform(
          tf.shape(t), (0, 0), 0.1, 0.9), t.dtype)
    return t

  return tf.nest.map_structure(fill, zeros)
