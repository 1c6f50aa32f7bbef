"""Experiment configs: one module per experiment, each `get_config()`.

This folder ships inside the package as `dist_keras.configs` (setup.py), so
an installed dist_keras finds its built-in configs by name from any
directory. No TensorFlow import here: configs load before TensorFlow starts.
"""
import ast
import importlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
  """Every experiment config in this folder (not the shared base)."""
  return sorted(f[:-3] for f in os.listdir(_HERE)
                if f.endswith(".py") and f not in ("__init__.py", "base.py"))


def path(name: str) -> str:
  """The file of built-in config `name` (which may not exist)."""
  return os.path.join(_HERE, f"{name}.py")


def load(name: str, overrides=()):
  """Config `name`'s config with "section.key=value" overrides applied.

  A value is read as a Python literal (3, 1e-3, True, (8, 16)), else kept as
  a string; the locked, typed ConfigDict refuses unknown keys and wrong types.
  """
  c = importlib.import_module(f"dist_keras.configs.{name}").get_config()
  return override(c, [o.split("=", 1) for o in overrides], parse=True)


def override(config, items, parse: bool = False):
  """Sets each (dotted key, value) of `items` in `config`; returns it.

  With `parse` (command-line text), a value is read as a Python literal
  when it is one; otherwise values are set as given. Unknown keys and wrong
  types raise (the config is locked and typed).
  """
  for key, value in items:
    section, field = key.split(".")
    if parse:
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass
    setattr(config[section], field, value)
  return config
