"""A keras.losses.Loss the model calls in its own call (a layer's
`self.add_loss(self.loss_fn(targets, logits))`: keras.io's endpoint layer)
trained and reported at N replicas as on one device.

Under tf.distribute Keras divides a Loss of a mean reduction by the
replica count where it reduces it (keras/src/losses/loss.py reduce_values:
scale_loss_for_distribution), so that the replicas' summed gradients are
the global batch's; its TF trainer divides each of the model's own losses
(the add_loss terms, in compute_loss) again. A Loss called in the model's
call and added with add_loss is so divided twice: N replicas trained on
1/N of one device's gradient and reported 1/N of its loss (at 2 replicas
half the train loss, val_loss and eval_loss that EarlyStopping and
ModelCheckpoint monitor), as fit under MirroredStrategy does; Adam, blind
to a gradient's scale, hid the gradient's half, SGD did not. A mean taken
by hand (ops.mean) is divided once, as it should be.

So in dist_keras' step on the compiled model and in every test_step
(`as_one_device`), a Loss reduced while the model's call runs (Keras'
call context is open, in this thread) is not divided: it is the replica's
batch mean one device computes, which compute_loss then divides once,
like a mean taken by hand. The compiled loss, reduced after the call, is
divided as before. A model's own train_step runs as written (one that
sums model.losses itself wants the divided value; one that calls
compute_loss does not; which, only its code knows), as under fit; one
that reaches the model's compute_loss is said at the start
(own_step_note). An own test_step computes no gradient: undivided is one
device's value there, whichever it does. Keras'
private parts here (scale_loss_for_distribution, the call context) are
checked by tests/training/test_own_losses.py.
"""
import contextlib
import threading

from keras.src.backend.common import global_state
from keras.src.losses import loss as keras_loss

from dist_keras import installation
from dist_keras.contract import checks
from dist_keras.training import step_losses

_HERE = "dist_keras/training/call_losses.py"
_SCALE = "scale_loss_for_distribution"
_STATE = threading.local()  # Each replica traces its step in a thread.


def install():
  """Has Keras' division of a reduced Loss by the replicas skip the Loss
  reduced in the model's call inside `as_one_device`; elsewhere it divides
  as Keras does. Returns what puts Keras' own back (the run's kept stack).

  Raises:
    RuntimeError: this Keras has no such function or call context.
  """
  original = installation.require(keras_loss, _SCALE,
                                  "its division of a loss by the replicas",
                                  _HERE)
  installation.require(global_state, "get_global_attribute",
                       "the layer call context", _HERE)
  if getattr(original, "dist_keras_installed", False):
    return lambda: None  # A run inside a run: the outer one puts it back.

  def scale(value):
    if in_model_call():
      _STATE.reductions = reductions() + 1
      return value
    return original(value)

  scale.dist_keras_installed = True
  setattr(keras_loss, _SCALE, scale)

  def put_back():
    if getattr(keras_loss, _SCALE) is scale:
      setattr(keras_loss, _SCALE, original)

  return put_back


def in_model_call() -> bool:
  """Whether this thread is inside `as_one_device` and a Keras layer's
  call (the model's, or one of its layers')."""
  return bool(getattr(_STATE, "depth", 0)) and (
      global_state.get_global_attribute("current_call_ctx") is not None)


def reductions() -> int:
  """How many Loss reductions this thread has left undivided so far."""
  return getattr(_STATE, "reductions", 0)


def own_step_note(model, replicas: int, forward) -> str | None:
  """The line of a model whose own train_step reaches compute_loss and
  whose call reduces a Loss (`forward`: state_updates.traced's), at N > 1:
  that step runs as written, the Loss divided twice, as under fit."""
  if (replicas == 1 or forward is None or not forward.loss_in_call
      or not checks.overrides(model, "train_step")
      or "compute_loss" not in step_losses.self_attributes(model,
                                                           "train_step")):
    return None
  return (f"the model's call reduces a keras.losses.Loss (for add_loss?), "
          f"which Keras divides by the {replicas} replicas there and "
          f"{type(model).__name__}.train_step's compute_loss divides again, "
          f"as under fit: if it is an add_loss term, the {replicas} replicas"
          f" train on 1/{replicas} of one device's gradient; add a mean "
          "taken by hand instead (keras.ops.mean(keras.losses.mean_squared_"
          "error(y, pred) * sample_weight), say)")


@contextlib.contextmanager
def as_one_device():
  """In the block (this thread), a Loss reduced in the model's call is
  not divided by the replicas (install)."""
  _STATE.depth = getattr(_STATE, "depth", 0) + 1
  try:
    yield
  finally:
    _STATE.depth -= 1
