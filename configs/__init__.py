"""Experiment configs: one module per experiment, each `get_config()`.

This folder ships inside the package as `dist_keras.configs` (setup.py), so
an installed dist_keras finds its built-in configs by name from any
directory. No TensorFlow import here: configs load before TensorFlow starts.

`from_command_line` is the one way a config is loaded from text (the
command line, every tool): a built-in name or a file, then overrides
"section.key=value", each bad one a one-line UserError naming it.
"""
import ast
import copy
import difflib
import importlib
import importlib.util
import inspect
import os
import re
import traceback
from collections.abc import Mapping

import ml_collections

from dist_keras import errors
from dist_keras.configs import base
from dist_keras.errors import UserError

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = "lstm_longmem"


def names() -> list[str]:
  """Every experiment config in this folder (not the shared base)."""
  return sorted(f[:-3] for f in os.listdir(_HERE)
                if f.endswith(".py") and f not in ("__init__.py", "base.py"))


def path(name: str) -> str:
  """The file of built-in config `name` (which may not exist)."""
  return os.path.join(_HERE, f"{name}.py")


def load(name: str, overrides=()):
  """Built-in config `name` with "section.key=value" overrides applied."""
  return from_command_line(name, overrides)


def from_command_line(spec: str = DEFAULT, overrides=(),
                      flag: str = "--config."):
  """The config `spec` names, with `overrides` applied.

  Args:
    spec: a built-in config's name or a config file's path (ending in .py),
      either with an optional ":ARG" passed to its get_config. A built-in's
      name never means a file (a workdir named like it, say).
    overrides: "section.key=value" texts; a value is parsed as the type of
      the key's current value (bool: true/false/1/0, or a bare
      "section.key" for true; tuple: a literal).
    flag: how the user spelled an override before its text, so that an
      error quotes what they typed ("--config." on the command line).

  Raises:
    UserError: one line naming the config or override that is wrong.
  """
  config = _load_file(spec)
  for text in overrides:
    key, eq, value = text.partition("=")
    if not re.fullmatch(r"\w+\.\w+", key):
      raise UserError(f"{flag}{text} is not SECTION.KEY=VALUE (e.g. "
                      f"{flag}train.steps=500).")
    if not eq:  # A bare boolean key means True, as absl's flags read it.
      value = "true" if _is_bool(config, key) else None
      if value is None:
        raise UserError(f"{flag}{key} needs a value: {flag}{key}=VALUE.")
    set_value(config, key, value, spelled=f"{flag}{key}", parse=True)
  check_types(config)
  return config


def resolve(config):
  """`dist_keras.fit`'s `config`: None (the defaults), a ConfigDict (a
  private copy) or a dict of "section.key" overrides of the defaults; a
  private ConfigDict either way."""
  if config is None:
    return base.get_config()
  if isinstance(config, ml_collections.ConfigDict):
    config = copy.deepcopy(config)
    check_types(config)
    return config
  if not isinstance(config, Mapping):
    raise UserError(f"config={type(config).__name__} is not a config; pass "
                    "a ConfigDict or a dict such as {'train.steps': 500}.")
  defaults = base.get_config()
  for key, value in config.items():
    if not re.fullmatch(r"\w+\.\w+", str(key)):
      raise UserError(f"config key {key!r} names no setting (keys are "
                      "'section.key'); every key and its default is in "
                      "configs/base.py.")
    set_value(defaults, key, value, spelled=f"config[{key!r}]")
  check_types(defaults)
  return defaults


def check_types(config) -> None:
  """UserError for a key missing, a key base.py does not have, or a value
  not of its default's type: ConfigDict's own type safety lets a bool pass
  for an int (True trains one step) and a None for anything, and a config
  file may build its ConfigDict from scratch or unlock() it (a misspelt key
  would then be ignored)."""
  defaults = base.get_config()
  for section, fields in defaults.items():
    for field, default in fields.items():
      try:
        value = config[section][field]
      except (KeyError, AttributeError, TypeError):
        raise UserError(f"the config has no {section}.{field}; build it from "
                        "dist_keras.configs.base.get_config() (every key and "
                        "its default are there).") from None
      if not _same_type(value, default):
        raise UserError(
            f"{section}.{field}={value!r} is of type {type(value).__name__}, "
            f"but it takes {type(default).__name__} values (default "
            f"{default!r}); "
            "every key and its default are in configs/base.py.")
  _check_known(config, defaults)


def _check_known(config, defaults) -> None:
  """UserError naming the first key of `config` that `defaults` lacks (its
  sections are ConfigDicts: check_types has checked every default key)."""
  known = [f"{section}.{field}" for section, fields in defaults.items()
           for field in fields]
  for section in config.keys():
    keys = ([f"{section}.{field}" for field in config[section].keys()]
            if section in defaults else [section])
    for key in keys:
      if key not in known:
        close = _nearest(key, known)
        raise UserError(
            f"config key {key!r} names no setting"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + "; every key and its default is in configs/base.py.")


def _nearest(key: str, known: list) -> list:
  """[the known key `key` most likely meant]: its field under another
  section first (train.seed -> runtime.seed), else the closest spelling."""
  field = key.rpartition(".")[2]
  moved = [k for k in known if k.rpartition(".")[2] == field]
  return moved[:1] or difflib.get_close_matches(key, known, n=1)


def _same_type(value, default) -> bool:
  if isinstance(default, bool) or isinstance(value, bool):
    return isinstance(value, bool) and isinstance(default, bool)
  if isinstance(default, float):
    return isinstance(value, (int, float))
  if isinstance(default, tuple):
    return isinstance(value, (tuple, list))
  return isinstance(value, type(default))


def set_value(config, key: str, value, spelled: str = "",
              parse: bool = False) -> None:
  """config[key] = value for a dotted `key`; with `parse`, `value` is text
  read as the type of the current value. UserError for an unknown key or a
  wrong type, naming the key as `spelled` (default: the key)."""
  spelled = spelled or key
  section, field = key.split(".")
  for part, known in ((section, config), (field, config.get(section))):
    if known is None or part not in known:
      close = difflib.get_close_matches(part, list(known or ()), n=1)
      raise UserError(
          f"{spelled} names no config key"
          + (f" (did you mean {close[0]!r}?)" if close else "")
          + "; every key and its default is in configs/base.py.")
  shown = value if parse else repr(value)
  try:
    if parse:
      value = _parse(config[section][field], value)
    setattr(config[section], field, value)
  except (TypeError, ValueError, SyntaxError, OverflowError) as e:
    raise UserError(f"{spelled}={shown}: {errors.first_line(e)}; fix the value's "
                    "type (see configs/base.py).") from None


def _is_bool(config, key: str) -> bool:
  section, field = key.split(".")
  try:
    return isinstance(config[section][field], bool)
  except (KeyError, AttributeError):
    return False  # set_value names the unknown key.


def _parse(current, text: str):
  """Command-line `text` as a value of `current`'s type."""
  if isinstance(current, bool):
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0"):
      raise ValueError(f"{text!r} is not a bool (true or false)")
    return lowered in ("true", "1")
  if isinstance(current, int):
    return int(text)
  if isinstance(current, float):
    return float(text)
  if isinstance(current, str) or current is None:
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise ValueError(f"{text!r} is not a Python literal (e.g. "
                     f"{current!r})") from None
  return tuple(value) if isinstance(current, tuple) and isinstance(
      value, list) else value


def _load_file(spec: str):
  name, _, arg = spec.partition(":")
  # Only a .py file can be a config file: a folder (a workdir named like a
  # built-in, say) or another file does not hide the built-in of its name.
  py_file = os.path.isfile(name) and name.endswith(".py")
  builtin = name in names() and not py_file
  if not builtin and os.path.isfile(name) and not py_file:
    raise UserError(
        f"--config={spec}: {name} is not a Python file (a config file's name "
        f"ends in .py); name a .py file or a built-in config "
        f"({', '.join(names())}).")
  try:
    if builtin:
      module = importlib.import_module(f"dist_keras.configs.{name}")
    else:
      module = _import_file(name)
    _check_argument(spec, name, module.get_config, arg)
    config = module.get_config(arg) if arg else module.get_config()
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if not builtin and os.path.isfile(name):
      raise _file_failed(spec, name, e) from e
    raise UserError(
        f"--config={spec} could not be loaded ({type(e).__name__}: "
        f"{errors.first_line(e)}); pass a built-in config ({', '.join(names())}) "
        "or a config file's path.") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise UserError(
        f"--config={spec}: get_config() returned a {type(config).__name__}, "
        "not an ml_collections.ConfigDict; start from "
        "dist_keras.configs.base.get_config() and change its keys.")
  return config


def _check_argument(spec: str, name: str, get_config, arg: str) -> None:
  """UserError if `get_config` cannot take what --config gave it (its
  own TypeError read as the file's fault, or as no such config)."""
  try:
    inspect.signature(get_config).bind(*([arg] if arg else []))
  except TypeError:
    if arg:
      raise UserError(f"--config={spec}: {name}'s get_config() takes no "
                      f"argument; pass --config={name}") from None
    raise UserError(f"--config={spec}: {name}'s get_config() needs an "
                    f"argument; pass --config={name}:ARG") from None
  except ValueError:  # No signature to read (a builtin): let it try.
    pass


def _file_failed(spec: str, file: str, error: Exception) -> UserError:
  """The line for a config file that raised: where in it, and the fix (a
  key a locked ConfigDict lacks gets the nearest one's name)."""
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if os.path.abspath(frame.filename) == os.path.abspath(file)]
  where = f"--config={spec}" + (f" line {lines[-1]}" if lines else "")
  # ml_collections' message for a locked ConfigDict's unknown attribute.
  missing = re.search(r'Key "(\w+)" does not exist', str(error))
  if missing:
    key = missing.group(1)
    fields = sorted({f for fs in base.get_config().values() for f in fs})
    close = difflib.get_close_matches(key, fields, n=1)
    return UserError(
        f"{where}: {key!r} names no config key"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + "; every key and its default is in configs/base.py.")
  # ml_collections' for a section the ConfigDict lacks: AttributeError('x').
  section = re.fullmatch(r"'(\w+)'", errors.first_line(error))
  if isinstance(error, AttributeError) and section:
    sections = list(base.get_config())
    close = difflib.get_close_matches(section.group(1), sections, n=1)
    return UserError(
        f"{where}: {section.group(1)!r} names no config section"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; the sections are {', '.join(sections)} (configs/base.py).")
  fix = _import_fix(error) or (
      "fix the file (every key and its default is in configs/base.py)")
  return UserError(f"{where}: the config file raised {type(error).__name__}:"
                   f" {errors.first_line(error)}; {fix}.")


def _import_fix(error: Exception) -> str | None:
  """The fix for an import a config file makes that failed: a module of
  the user's not on the path, or not installed; a name a module lacks."""
  if not isinstance(error, ImportError):
    return None
  if not isinstance(error, ModuleNotFoundError):  # "cannot import name".
    return "fix the name it imports"
  return ("run from the folder that holds the module it imports, or add "
          "that folder to PYTHONPATH (or pip install it, if it is a package)")


def _import_file(file: str):
  if os.path.isdir(file):
    raise IsADirectoryError(f"{file} is a folder, not a config file")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"no such file: {file}")
  name = "dist_keras_user_config_" + re.sub(r"\W", "_", os.path.abspath(file))
  spec = importlib.util.spec_from_file_location(name, file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
