"""Model registry: `build(model_cfg, input_spec) -> keras.Model`.

Builders create layers only: no strategy, no compile, no globals. The caller
builds them inside `strategy.scope()` so every variable is mirrored.
"""
import keras

from dist_keras.errors import check_choice
from dist_keras.models import cnn, language, resnet, sequence

_MODULES = {"sequence_classifier": sequence, "cnn": cnn, "char_lm": language,
            "resnet50": resnet}


def _module(model_cfg):
  check_choice("model.name", model_cfg.name, sorted(_MODULES))
  return _MODULES[model_cfg.name]


def inputs(model_cfg) -> str:
  """What model `model_cfg.name` reads: images | tokens | per_token (tokens
  with one label each); data.name=synthetic makes batches of that kind."""
  return _module(model_cfg).INPUTS


def check(model_cfg, input_spec) -> None:
  """Raises UserError if `model_cfg` cannot be built for `input_spec`."""
  _module(model_cfg).check(model_cfg, input_spec)


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the model `model_cfg.name` for inputs described by `input_spec`."""
  check(model_cfg, input_spec)
  return _MODULES[model_cfg.name].build(model_cfg, input_spec)
