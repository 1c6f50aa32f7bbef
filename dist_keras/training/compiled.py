"""What the user's model was compiled with that the loop honours, or
refuses: run_eagerly, steps_per_execution, jit_compile, its own train_step
and test_step. Keras' fit is the reference meaning of each
(docs/own_models.md has the table)."""
import tensorflow as tf

from dist_keras.errors import UserError
from dist_keras.training import model_step


def take(model, strategy, train_cfg) -> list[str]:
  """Applies what `fit` would honour to `train_cfg` (steps per call, XLA);
  returns the notes the run says before its first step.

  Raises:
    UserError: run_eagerly=True, a steps_per_execution that contradicts
      train.steps_per_loop, or XLA over a multi-device step the model
      writes itself.
  """
  if model.run_eagerly:
    raise UserError(
        f"model {model.name!r} was compiled with run_eagerly=True; "
        "dist_keras runs its steps as tf.functions on every replica, so "
        "compile it without run_eagerly (debug eagerly with model.fit on "
        "one device).")
  notes = [_steps_per_execution(model, train_cfg)]
  if model.jit_compile is True and not train_cfg.jit_compile:
    train_cfg.jit_compile = True
    notes.append("XLA: the model was compiled with jit_compile=True "
                 "(train.jit_compile=true)")
  if model_step.overrides(model, "train_step"):
    notes.append(_own_step_note(model, strategy, train_cfg))
  if not model_step.evaluates(model):
    notes.append(f"no eval: {type(model).__name__} has no compiled loss and "
                 "no test_step of its own")
  return [note for note in notes if note]


def _steps_per_execution(model, train_cfg) -> str | None:
  """The model's steps_per_execution as steps per call, as fit runs them."""
  per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
  if per_execution == 1:
    return None
  if train_cfg.steps_per_loop not in (0, per_execution):
    raise UserError(
        f"model {model.name!r} was compiled with steps_per_execution="
        f"{per_execution} but train.steps_per_loop="
        f"{train_cfg.steps_per_loop}; set one of them (or both alike).")
  train_cfg.steps_per_loop = per_execution
  return (f"steps per call: {per_execution} (the model's "
          "steps_per_execution)")


def _own_step_note(model, strategy, train_cfg) -> str:
  """The line a model's own train_step gets; refuses XLA where its update
  cannot compile."""
  if train_cfg.jit_compile and not isinstance(
      strategy, (tf.distribute.OneDeviceStrategy, tf.distribute.TPUStrategy)):
    raise UserError(
        f"train.jit_compile=true with {type(model).__name__}'s own "
        "train_step under a multi-device strategy: XLA cannot compile its "
        "optimizer's cross-device update (merge_call); use one device or a "
        "TPU, or set train.jit_compile=false.")
  return (f"{type(model).__name__}.train_step is the model's own: it runs "
          "as written on every replica (gradients all-reduced in its "
          "optimizer's apply); the sync breakdown splits its steps into "
          "input wait and model step only, and there is no calibration")
