"""The variables a compiled model's step trains: read as the step is
traced, as Keras' own train_step reads `trainable_weights`.

Keras' fit traces its one step function at its first call, after the
callbacks' on_train_begin and first on_epoch_begin, and never again: a
layer a callback freezes there trains no more; one frozen later keeps
training (the traced step holds its variables). dist_keras' step reads
them at the same moment (steps.py), so that its gradients, their
all-reduce and the update are of one list; the loop's second function (a
timed step and plain ones: calls.py), traced later, takes the first one's
list, as fit's one function would. The loop says once, at an epoch
boundary, when the model's trainable set is no longer the traced one
(changed_line). A resumed run traces after the callbacks that froze a
layer before it stopped, so it trains as such a fit resumed by
BackupAndRestore would, not as the run it resumes (docs/own_models.md).
"""
from dist_keras.errors import UserError
from dist_keras.training import keras_internals


def read(model, traced: list | None = None) -> list:
  """The variables a step tracing now takes the gradients of and updates:
  the model's trainable ones, or those of the process's first trace where
  `traced` holds them (it keeps them: [variables]).

  Raises:
    UserError: one the optimizer was built without (made trainable after
      model_fn; Keras' fit on one device builds its optimizer at its first
      step, under a strategy before on_train_begin: "Unknown variable").
  """
  if traced:
    return traced[0]
  variables = model.trainable_variables
  built = keras_internals.built_on(model.optimizer)
  known = {id(v) for v in (variables if built is None else built)}
  unknown = [v for v in variables if id(v) not in known]
  if unknown:
    raise UserError(
        f"variable {unknown[0].path!r} of model {model.name!r} was made "
        "trainable after model_fn returned: the optimizer was built then, on"
        " the variables trainable then (its slots cannot be made in a "
        "replica's step), so it cannot update it; leave the layer trainable"
        " in model_fn and freeze it in a callback's on_train_begin instead.")
  if traced is not None:
    traced.append(variables)
  return variables


def changed_line(model, traced: list) -> str | None:
  """The line for a model whose trainable variables are not those its
  step traced with (`traced`: read's), else None. Per epoch, on the host."""
  if not traced:
    return None
  held, now = traced[0], model.trainable_variables
  held_ids, ids = {id(v) for v in held}, {id(v) for v in now}
  frozen = [v for v in held if id(v) not in ids]
  if frozen:
    return (f"{_named(frozen)} was frozen after the step was traced: it "
            "keeps training, as under Keras' fit; freeze it in model_fn or "
            "on_train_begin")
  thawed = [v for v in now if id(v) not in held_ids]
  if thawed:
    return (f"{_named(thawed)} was made trainable after the step was "
            "traced: it stays frozen, as under Keras' fit; set trainable in "
            "model_fn or on_train_begin")
  return None


def _named(variables) -> str:
  more = len(variables) - 1
  return f"variable {variables[0].path!r}" + (
      f" (and {more} more)" if more else "")
