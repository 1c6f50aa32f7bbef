"""The README's key table names every config key, and only those, and the
choices it lists for `runtime.strategy`, `model.name` and `data.name` are
the ones validation takes: a key or choice added (or removed) without the
table changing fails here, not in a user's hands. No TensorFlow import (the
base config is ml_collections only; validate and catalog are TF-free).
"""
import importlib.util
import os
import re

from dist_keras import catalog
from dist_keras import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A row of the table: | `section` (optional links) | keys |
_ROW = re.compile(r"^\|\s*`(\w+)`[^|]*\|(.*)\|\s*$")


def base_keys() -> dict:
  """{section: set of keys} of configs/base.py's get_config()."""
  spec = importlib.util.spec_from_file_location(
      "doc_keys_base", os.path.join(REPO, "configs", "base.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  return {s: set(config[s].keys()) for s in config.keys()}


def table_keys(text: str, sections) -> dict:
  """{section: set of keys} of the rows of `text` that start with a
  section's name in backticks: the keys are the column's backticked names
  outside parentheses (which hold choices, links and notes)."""
  found = {}
  for line in text.splitlines():
    match = _ROW.match(line)
    if not match or match.group(1) not in sections:
      continue
    keys = _outside_parentheses(match.group(2))
    found[match.group(1)] = set(re.findall(r"`(\w+)`", keys))
  return found


def _outside_parentheses(text: str) -> str:
  depth, kept = 0, []
  for char in text:
    depth += char == "("
    if depth == 0:
      kept.append(char)
    depth -= char == ")" and depth > 0
  return "".join(kept)


def differences(documented: dict, actual: dict) -> list:
  """One line per section whose documented keys differ from the actual."""
  lines = []
  for section in sorted(actual):
    have = documented.get(section)
    if have is None:
      lines.append(f"{section}: no row")
      continue
    missing, extra = actual[section] - have, have - actual[section]
    if missing or extra:
      lines.append(f"{section}: not in the table {sorted(missing)}, "
                   f"not in base.py {sorted(extra)}")
  return lines


def test_readme_key_table_is_base_configs_keys():
  actual = base_keys()
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    documented = table_keys(f.read(), actual)
  assert not differences(documented, actual), "\n".join(
      differences(documented, actual))


def test_a_missing_or_extra_key_is_reported():
  text = ("| `train` ([speed](docs/performance.md)) | `steps`, `optimizer` "
          "(sgd, `adam`), `gone` |\n")
  documented = table_keys(text, {"train", "eval"})
  assert documented == {"train": {"steps", "optimizer", "gone"}}
  lines = differences(documented, {"train": {"steps", "optimizer", "lr"},
                                   "eval": {"every"}})
  assert lines == ["eval: no row",
                   "train: not in the table ['lr'], not in base.py ['gone']"]


def listed_choices(text: str, section: str, key: str) -> set:
  """The comma-separated words in parentheses after `key` in `section`'s
  row (placeholders such as tfds:NAME and PKG.MODULE:FN left out)."""
  for line in text.splitlines():
    match = _ROW.match(line)
    if match and match.group(1) == section:
      choices = re.search(rf"`{key}` \(([^)]*)\)", match.group(2))
      assert choices, f"{section}.{key}: no (choices) in its row"
      words = [w.strip() for w in choices.group(1).split(",")]
      return {w for w in words if not re.search(r"[A-Z]", w)}
  raise AssertionError(f"{section}: no row")


def test_readme_lists_the_choices_validation_takes():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert listed_choices(text, "runtime", "strategy") == set(
      validate.STRATEGIES)
  assert listed_choices(text, "model", "name") == set(catalog.MODELS)
  assert listed_choices(text, "data", "name") == set(catalog.DATASETS)
