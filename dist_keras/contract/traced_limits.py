"""What Keras 3's TensorFlow backend cannot trace in a tf.function, where
Keras' own fit fails alike on one device: refused before anything is
written where the model shows it (check), else said in one line where the
first step's trace meets it (fault). Both are exit 2, as any refusal.

- A name TensorFlow refuses for a name scope. Each layer's call opens a
  scope of its name; at a graph's root (the step's outermost call: the
  model's, in Keras' train_step) a name must begin with a letter, a digit
  or '.', so a model class `_Net` (default name "__net") cannot be traced.
- keras.RematScope(mode="full", "larger_than" or "list_of_layers"): the
  layers built inside it rematerialize their call through TensorFlow's
  custom_gradient, which takes keyword arguments (Keras passes `training`
  and `mask` so) only eagerly. mode="activations" rematerializes the
  activation functions alone, called positionally: it traces.

Keras' name-scope stack is left pushed by such a name's refusal:
installation.keras_name_scopes_kept puts it back.
"""
import re

from dist_keras import installation
from dist_keras.errors import UserError

# TensorFlow's patterns (tensorflow/python/framework/ops.py): a graph's
# outermost scope's name; its refusal names the name it refused.
_ROOT_SCOPE = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")
_SCOPE = re.compile(r"^[A-Za-z0-9_.\\/>-]*$")  # Inside another scope.
_REFUSED_NAME = re.compile(r"'([^']*)' is not a valid (?:root )?scope name")
_KEYWORDS_EAGER_ONLY = "custom_gradient decorator currently supports keywords"
_REMATERIALIZED = ("full", "larger_than", "list_of_layers")


def check(model, own_train_step: bool) -> None:
  """Refuses a model whose call Keras' train_step (not `own_train_step`)
  cannot trace: its name refused at the graph's root, or its call
  rematerialized with keyword arguments (built inside a RematScope)."""
  if own_train_step:
    return  # Whether its step calls the model at all is found at step 1.
  _check_call(model, _ROOT_SCOPE, "the train step")


def check_eval(model) -> None:
  """Refuses a model with its own train_step whose eval, Keras' test_step,
  cannot trace its call (found at the first eval otherwise, after training
  steps): its name refused inside a graph's scope (the eval calls it inside
  its loop over the batches), or its call rematerialized with keywords."""
  _check_call(model, _SCOPE, "Keras' test_step (the eval)")


def _check_call(model, scope, where: str) -> None:
  """Refuses a model called as Keras' steps call it, `where` a scope of
  its name must match `scope`."""
  if not scope.match(model.name):
    raise UserError(_scope_line(model, model, model.name, where))
  # Keras' steps pass `training` to a call that takes it, and
  # Keras passes `mask` to one that takes it: keywords, always.
  params = getattr(model, "call_signature_parameters", ())
  mode = _rematerialized(model)
  if mode not in (None, "larger_than") and (
      "training" in params or "mask" in params):
    raise UserError(_remat_line(model, model, mode))


def fault(error: BaseException, model) -> UserError | None:
  """The one line of an error a step's trace raised for one of the limits
  above, or None for another error."""
  if not isinstance(error, ValueError) or isinstance(error, UserError):
    return None
  text = str(error)
  refused = _REFUSED_NAME.search(text)
  if refused is None and _KEYWORDS_EAGER_ONLY not in text:
    return None
  layers = installation.layers_in(model, include_self=True)
  if refused:
    name = refused.group(1)
    layer = next((l for l in layers if l.name == name), None)
    return UserError(_scope_line(model, layer, name))
  for layer in layers:
    mode = _rematerialized(layer)
    if mode is not None:
      return UserError(_remat_line(model, layer, mode))
  return UserError(
      "a function wrapped by keras.remat or tf.custom_gradient is called "
      "with keyword arguments in the traced train step, which TensorFlow "
      "takes only eagerly (Keras' fit fails alike); pass its arguments "
      "positionally.")


def _scope_line(model, layer, name: str,
                where: str = "the train step") -> str:
  """The line refusing `name` as a scope's: the name of `layer` (the
  model, or a layer in it; None where none bears it)."""
  what = (f"model {name!r}" if layer is model else
          f"layer {name!r} of model {model.name!r}" if layer is not None
          else f"a layer or model named {name!r}")
  cls = "" if layer is None else f" (class {type(layer).__name__})"
  better = re.sub(r"[^A-Za-z0-9_.>-]", "", name).lstrip("_->") or "net"
  return (
      f"{what}{cls} cannot be traced: TensorFlow refuses {name!r} as a name "
      f"scope where {where} calls it (at a graph's outermost scope a "
      "name must begin with a letter, digit or '.'; inside, letters, digits"
      " and _.->\\ only), and Keras' fit fails on it alike; pass it a name"
      f" such as name={better!r} (Keras names it after its class: one "
      "without a leading '_' needs none).")


def _remat_line(model, layer, mode: str) -> str:
  what = (f"model {model.name!r}" if layer is model else
          f"layer {layer.name!r} of model {model.name!r}")
  return (
      f"{what} was built inside keras.RematScope(mode={mode!r}), which "
      "Keras' TensorFlow backend cannot trace in a tf.function (its "
      "rematerialized call takes keyword arguments only eagerly), and "
      "Keras' fit fails on it alike; use keras.RematScope(mode="
      "'activations'), or build the model outside the RematScope.")


def _rematerialized(layer) -> str | None:
  """The mode of the RematScope `layer` was built in (Keras records it on
  the layer) where it rematerializes the layer's whole call: "full";
  "list_of_layers" naming the layer; "larger_than" where its output is
  (its size is known only in the call). None: its call runs as written."""
  mode = getattr(layer, "_remat_mode", None)
  if mode is None or mode.mode not in _REMATERIALIZED:
    return None
  if mode.mode == "list_of_layers" and layer.name not in mode.layer_names:
    return None
  return mode.mode
