"""A config's keys and values: each value's type checked, command-line
text read as its key's type, and the one line naming a key that does not
exist or a value its key cannot take (configs/__init__.py's loading and
`dist_keras.fit`'s dict of overrides share them).
"""
import ast
import difflib

from dist_keras import errors
from dist_keras.configs import base
from dist_keras.errors import UserError

# Where a user finds every key: the module is there in a checkout (as
# configs/base.py) and in an installed wheel alike.
KEYS_ARE_IN = "every key and its default is in dist_keras.configs.base"


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
            f"{default!r}); {KEYS_ARE_IN}.")
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
            + f"; {KEYS_ARE_IN}.")


def did_you_mean(word: str, known) -> str:
  """' (did you mean 'X'?)' for the one of `known` nearest `word`'s
  spelling, as difflib finds it; '' if none is near."""
  close = difflib.get_close_matches(word, list(known), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


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
      raise UserError(f"{spelled} names no config key"
                      f"{did_you_mean(part, known or ())}; {KEYS_ARE_IN}.")
  current = config[section][field]
  try:
    setattr(config[section], field,
            _parse(current, value) if parse else value)
  except OverflowError as e:  # An int too large for a float key.
    raise UserError(f"{spelled}={value if parse else repr(value)}: "
                    f"{errors.first_line(e)}; {KEYS_ARE_IN}.") from None
  except (TypeError, ValueError, SyntaxError):
    raise UserError(_wrong_type(spelled, value, current, parse)) from None


def _wrong_type(spelled: str, value, current, parse: bool) -> str:
  """The line for `value` (command-line text if `parse`), which key
  `spelled`, now `current`, cannot take: what it is, what the key takes,
  and how to write one (a one-element tuple: with its comma)."""
  given, wanted = _read(value) if parse else value, type(current).__name__
  what = (f"is not {_a(wanted)}" if given is _UNREADABLE
          or isinstance(given, type(current)) else
          f"is {_a(type(given).__name__)}; the key takes {_a(wanted)}")
  scalar = isinstance(current, tuple) and type(given) in (int, float)
  if parse:
    fix = (f"`{spelled}={given},` or `{spelled}='({given},)'`" if scalar
           else f"e.g. `{spelled}={_as_text(current)}`")
    return f"{spelled}={value} {what}: write {fix}."
  return (f"{spelled}={value!r} {what}: pass "
          f"{(given,) if scalar else f'e.g. {current!r}'}.")


_UNREADABLE = object()  # Command-line text that is no Python literal.


def _read(text: str):
  """The Python literal command-line `text` reads as, or _UNREADABLE."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return _UNREADABLE


def _a(type_name: str) -> str:
  return f"{'an' if type_name[0] in 'aeiou' else 'a'} {type_name}"


def _as_text(value) -> str:
  """`value` as an override's text: 16,32,64 for a tuple, true for True."""
  if isinstance(value, tuple):
    return ",".join(map(str, value)) + ("," if len(value) == 1 else "")
  return str(value).lower() if isinstance(value, bool) else str(value)


def is_bool(config, key: str) -> bool:
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
  value = ast.literal_eval(text)  # Its errors: set_value's _wrong_type.
  return tuple(value) if isinstance(current, tuple) and isinstance(
      value, list) else value
