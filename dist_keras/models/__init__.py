"""Model registry: `build(model_cfg, input_spec) -> keras.Model`.

Builders create layers only: no strategy, no compile, no globals. The caller
builds them inside `strategy.scope()` so every variable is mirrored.
"""
from typing import Callable

import keras

from dist_keras.errors import UserError
from dist_keras.models import cnn, sequence

_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "sequence_classifier": sequence.build,
    "cnn": cnn.build,
}


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the model `model_cfg.name` for inputs described by `input_spec`."""
  if model_cfg.name not in _BUILDERS:
    raise UserError(f"model.name={model_cfg.name!r} is not one of "
                    f"{', '.join(sorted(_BUILDERS))}; pick one of those.")
  return _BUILDERS[model_cfg.name](model_cfg, input_spec)
