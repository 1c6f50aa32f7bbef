"""Experiment configs: one module per experiment, each `get_config()`."""
import ast
import importlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
  """Every experiment config in this folder (not the shared base)."""
  return sorted(f[:-3] for f in os.listdir(_HERE)
                if f.endswith(".py") and f not in ("__init__.py", "base.py"))


def load(name: str, overrides=()):
  """`configs/NAME.py`'s config with "section.key=value" overrides applied.

  A value is read as a Python literal (3, 1e-3, True, (8, 16)), else kept as
  a string; the locked, typed ConfigDict refuses unknown keys and wrong types.
  """
  c = importlib.import_module(f"configs.{name}").get_config()
  for override in overrides:
    key, raw = override.split("=", 1)
    section, field = key.split(".")
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    setattr(c[section], field, value)
  return c
