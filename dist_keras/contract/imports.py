"""Users' own functions named in a config: `PKG.MODULE:FN` import paths.

`--config.model.name=my_project.models:make_model` names a `model_fn`, and
`--config.data.name=my_project.data:make_dataset` a `dataset_fn`, so every
worker of a cluster (each runs `python -m dist_keras.train`) loads the same
code without a driver script. Modules are found on `sys.path` plus the
current directory (as `python -m` does; a console script would not).
No TensorFlow import here: names are checked before TensorFlow starts.
"""
import importlib
import os
import re
import sys

from dist_keras import errors
from dist_keras.errors import UserError
from dist_keras.validate import is_import_path  # noqa: F401  (re-exported)

_MODULE = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"


def load(key: str, name: str):
  """The callable `name` (PKG.MODULE:FN) names; `key` is its config key.

  Raises:
    UserError: the name is malformed, its module does not import (the
      module's own error, in one line), or it names no callable.
  """
  module_name, _, attr = name.partition(":")
  if not (re.fullmatch(_MODULE, module_name) and re.fullmatch(_MODULE, attr)):
    raise UserError(f"{key}={name!r} is not PKG.MODULE:FN (e.g. "
                    "my_project.models:make_model).")
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.append(os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except
    # Anything the user's module raises at import is theirs to fix: say
    # what it was, on one line, with where Python looked.
    raise UserError(
        f"{key}={name!r}: importing {module_name} failed ({type(e).__name__}:"
        f" {errors.first_line(e)}); run from the folder that holds it or add that "
        "folder to PYTHONPATH.") from e
  target = module
  for part in attr.split("."):
    target = getattr(target, part, None)
  if target is None:
    raise UserError(f"{key}={name!r}: module {module_name} "
                    f"({getattr(module, '__file__', '?')}) has no {attr!r}.")
  if not callable(target):
    raise UserError(f"{key}={name!r} names a {type(target).__name__}, not a "
                    "function; name the function that builds it.")
  return target


def name_of(fn) -> str:
  """PKG.MODULE:FN of a function, as config.json records it."""
  module = getattr(fn, "__module__", None) or "?"
  return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"
