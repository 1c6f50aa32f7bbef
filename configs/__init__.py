"""Experiment configs: one module per experiment, each `get_config()`.

This folder ships inside the package as `dist_keras.configs` (setup.py), so
an installed dist_keras finds its built-in configs by name from any
directory. No TensorFlow import here: configs load before TensorFlow starts.

`from_command_line` is the one way a config is loaded from text (the
command line, every tool): a built-in name or a file, then overrides
"section.key=value", each bad one a one-line UserError naming it, as is a
key the user set that the chosen built-in model or data does not read.
"""
import copy
import importlib
import importlib.util
import inspect
import os
import re
import traceback
from collections.abc import Mapping

import ml_collections

from dist_keras import catalog, errors
from dist_keras.configs import base
# (check_types: this package's too, as it was.)
from dist_keras.configs._values import (KEYS_ARE_IN, check_types,
                                        did_you_mean, is_bool, set_value)
from dist_keras.errors import UserError

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = "lstm_longmem"


def names() -> list[str]:
  """Every experiment config in this folder (not the shared base, nor a
  module of this package's own: _values.py)."""
  return sorted(f[:-3] for f in os.listdir(_HERE) if f.endswith(".py")
                and not f.startswith("_") and f != "base.py")


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
    UserError: one line naming the config or override that is wrong, or
      a key the user set (an override; a config file's change of base.py's
      default) that the config's built-in model or data does not read.
  """
  config, user_set = _load_file(spec), {}
  for text in overrides:
    key, eq, value = text.partition("=")
    if not re.fullmatch(r"\w+\.\w+", key):
      raise UserError(f"{flag}{text} is not SECTION.KEY=VALUE (e.g. "
                      f"{flag}train.steps=500).")
    if not eq:  # A bare boolean key means True, as absl's flags read it.
      value = "true" if is_bool(config, key) else None
      if value is None:
        raise UserError(f"{flag}{key} needs a value: {flag}{key}=VALUE.")
    set_value(config, key, value, spelled=f"{flag}{key}", parse=True)
    user_set[key] = f"{flag}{text}"
  check_types(config)
  name = spec.partition(":")[0]
  if not (_is_builtin(name) or _is_shipped(name)):  # A file of the user's.
    user_set = {**_set_off_builtins(config, f"--config={spec} sets "),
                **user_set}
  refuse_unread(config, user_set)
  return config


def refuse_unread(config, user_set: dict) -> None:
  """UserError for the first key of `user_set` ({"section.key": how the
  user set it}) that the config's built-in model or data does not read
  (catalog.py): it would be ignored. Only what the user set: base.py gives
  every model's keys, and a built-in config sets its own model's only."""
  line = catalog.unread(config, user_set)
  if line:
    raise UserError(line)


def set_in(given, config) -> dict:
  """refuse_unread's `user_set` for `dist_keras.fit`'s `config` (`given`;
  `config`: as resolved): a dict's keys; a ConfigDict's keys whose value
  is neither base.py's default nor any built-in config's. A ConfigDict does
  not say which keys were set: a built-in config's with its model switched
  is not refused for the keys that config set, as on the command line."""
  if isinstance(given, Mapping):
    return {str(key): f"config[{key!r}]={value!r}"
            for key, value in given.items()}
  if not isinstance(given, ml_collections.ConfigDict):
    return {}
  return _set_off_builtins(config, "config sets ")


def _set_off_builtins(config, how: str) -> dict:
  """_changed's keys whose value is no built-in config's either: a config
  built from a built-in one (a ConfigDict, a user's config file calling
  its get_config()) with its model or data switched keeps that one's
  keys, which the user did not set."""
  builtins = [_load_file(name) for name in names()]
  return {key: text for key, text in _changed(config, how).items()
          if all(_value(b, key) != _value(config, key) for b in builtins)}


def _value(config, key: str):
  section, field = key.split(".")
  return config[section][field]


def _changed(config, how: str) -> dict:
  """{key: how + "key=value"} of each key whose value `config` changed
  from base.py's default."""
  return {f"{section}.{field}": f"{how}{section}.{field}={value!r}"
          for section, fields in base.get_config().items()
          for field, default in fields.items()
          if (value := config[section][field]) != default}


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
                      f"'section.key'); {KEYS_ARE_IN}.")
    set_value(defaults, key, value, spelled=f"config[{key!r}]")
  check_types(defaults)
  return defaults


def _is_builtin(name: str) -> bool:
  """Whether --config's `name` means a built-in config. Only a .py file can
  be a config file: a folder (a workdir named like a built-in, say) or
  another file does not hide the built-in of its name."""
  return name in names() and not (os.path.isfile(name)
                                  and name.endswith(".py"))


def _is_shipped(path: str) -> bool:
  """Whether `path` is a built-in config's own file (configs/NAME.py, as
  the docs write it): the keys it sets are its model's, not the user's."""
  here = os.path.dirname(os.path.realpath(__file__))
  real = os.path.realpath(path)
  return (os.path.isfile(real) and os.path.dirname(real) == here
          and os.path.basename(real)[:-len(".py")] in names())


def _load_file(spec: str):
  name, _, arg = spec.partition(":")
  builtin = _is_builtin(name)
  if not builtin and os.path.isfile(name) and not name.endswith(".py"):
    raise UserError(
        f"--config={spec}: {name} is not a Python file (a config file's name "
        f"ends in .py); name a .py file or a built-in config "
        f"({', '.join(names())}).")
  _refuse_missing_builtin_file(spec, name)
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
    # No such file and no built-in of that name: likely a built-in's typo.
    close = (did_you_mean(name, names())
             if isinstance(e, FileNotFoundError) else "")
    raise UserError(
        f"--config={spec} could not be loaded ({type(e).__name__}: "
        f"{errors.first_line(e)}){close}; pass a built-in config "
        f"({', '.join(names())}) or a config file's path.") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise UserError(
        f"--config={spec}: get_config() returned a {type(config).__name__}, "
        "not an ml_collections.ConfigDict; start from "
        "dist_keras.configs.base.get_config() and change its keys.")
  return config


def _refuse_missing_builtin_file(spec: str, name: str) -> None:
  """UserError for a built-in config's path where there is no such file
  (configs/NAME.py outside a checkout: an installed dist_keras has its
  configs in the package): the name runs that built-in from any folder."""
  stem = os.path.basename(name).removesuffix(".py")
  if (name.endswith(".py") and stem in names()
      and not os.path.exists(name)):
    arg = spec.partition(":")[2]
    raise UserError(
        f"--config={spec}: there is no file {name} here; pass "
        f"--config={stem}{':' + arg if arg else ''}, the built-in config's "
        "name, which works from any folder.")


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
    return UserError(f"{where}: {key!r} names no config key"
                     f"{did_you_mean(key, fields)}; {KEYS_ARE_IN}.")
  # ml_collections' for a section the ConfigDict lacks: AttributeError('x').
  section = re.fullmatch(r"'(\w+)'", errors.first_line(error))
  if isinstance(error, AttributeError) and section:
    sections = list(base.get_config())
    return UserError(
        f"{where}: {section.group(1)!r} names no config section"
        f"{did_you_mean(section.group(1), sections)}; the sections are "
        f"{', '.join(sections)} (dist_keras.configs.base).")
  fix = _import_fix(error) or (
      f"fix the file ({KEYS_ARE_IN})")
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
