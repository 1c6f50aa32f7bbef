"""A dict of features against a functional model's dict of Inputs.

Keras hands a dict of features to a dict of Inputs by position, both in
sorted key order (Functional._standardize_inputs flattens them): a
feature the model has no Input for (an id kept for later) that sorts
before an Input's name takes that Input's place. Keras' fit then fails at
its first step ("Invalid input shape"), or, where the shapes agree,
trains on the wrong feature. One that sorts after every name is left
out, as fit leaves it (with Keras' warning).
"""
import keras

from dist_keras.errors import UserError


def check_input_keys(model, x, where: str) -> None:
  """Raises UserError if a feature of batches `x` the model has no Input for
  would take an Input's place."""
  inputs = _input_dict(model)
  if inputs is None or not isinstance(x, dict):
    return
  names = sorted(inputs)
  for name, key in zip(names, sorted(x)):
    if key == name:
      continue
    if key in inputs:  # An Input without its feature: Keras' error says it.
      return
    kept = repr(tuple(names))
    raise UserError(
        f"{where} yields the feature {key!r}, which model {model.name!r} has"
        f" no Input for (its Inputs: {', '.join(names)}): Keras hands a dict"
        " of features to a dict of Inputs in sorted key order, so it would "
        f"take the place of Input {name!r} (Keras' fit fails on it, or "
        "trains on the wrong feature); leave it out of x (ds.map(lambda x, "
        f"*rest: ({{k: x[k] for k in {kept}}}, *rest))), or give the model "
        f"an Input named {key!r}.")


def _input_dict(model) -> dict | None:
  """A functional model's Inputs where they are a flat dict, else None
  (a subclassed model's call takes its features as it wants)."""
  try:
    inputs = model.input
  except (AttributeError, ValueError):  # Subclassed, or never called.
    return None
  if not isinstance(inputs, dict) or not all(
      isinstance(v, keras.KerasTensor) for v in inputs.values()):
    return None
  return inputs
