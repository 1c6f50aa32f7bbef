"""The tools' `--config` name and `section.key=value` overrides, checked once.

Every tool trains a shipped config with the user's overrides. A typo must
fail at once, in one line naming the bad value, before any run: not as a
ConfigDict traceback, and not after every point of a sweep has failed alike.
"""
import os
import re

from dist_keras import configs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BadConfigArg(ValueError):
  """A config name or override that names nothing loadable."""


def config_name(text: str) -> str:
  """"lstm_longmem" or "configs/lstm_longmem.py" -> "lstm_longmem"."""
  name = os.path.basename(text)
  name = name[:-3] if name.endswith(".py") else name
  shipped = configs.path(name)
  # A path must lead to the shipped file (from here or from the checkout).
  elsewhere = os.path.dirname(text) and shipped not in {
      os.path.abspath(text), os.path.abspath(os.path.join(REPO, text))}
  if name not in configs.names() or elsewhere:
    raise BadConfigArg(f"--config={text!r} is not a config in configs/; use "
                       f"one of {', '.join(configs.names())}.")
  return name


def check_overrides(name: str, overrides: list[str], flag: str) -> None:
  """Loads `name` with each override alone, to name the bad one.

  `flag` is how the user spelled the override before its text
  ("--config." or "--override="), so the message quotes what they typed.
  """
  for override in overrides:
    if not re.fullmatch(r"\w+\.\w+=.*", override, re.DOTALL):
      raise BadConfigArg(f"{flag}{override} is not SECTION.KEY=VALUE "
                         "(e.g. train.optimizer=sgd).")
    try:
      configs.load(name, [override])
    except (AttributeError, KeyError, TypeError, ValueError) as e:
      raise BadConfigArg(f"{flag}{override}: {one_line(e)}; every key and "
                         "its type is in configs/base.py.") from None


def one_line(e: Exception) -> str:
  """One line from ConfigDict's multi-line errors."""
  text = str(e.args[0] if e.args else e)
  hint = re.search(r'Did you mean "(\w+)"', text)
  if "does not exist" in text or isinstance(e, KeyError):
    return "names no config key" + (f" (did you mean {hint.group(1)!r}?)"
                                     if hint else "")
  return text.splitlines()[0]


def checked(parser, config_text: str, overrides: list[str],
            flag: str = "--override=") -> str:
  """The config name, or the parser's one-line error and exit 2."""
  try:
    name = config_name(config_text)
    check_overrides(name, overrides, flag)
  except BadConfigArg as e:
    parser.error(str(e))
  return name
