"""What the installed package says names only what its user has: no
message, and no --help a module prints from its own docstring, names a
file of the repository that the wheel does not ship (tools/..., or a
config by its checkout path, configs/base.py). The wheel ships the
launcher and the data preparer as `python -m dist_keras.launch` and
`python -m dist_keras.prepare_data` (read from the source)."""
import ast
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted([
    *glob.glob(os.path.join(REPO, "dist_keras", "**", "*.py"), recursive=True),
    *glob.glob(os.path.join(REPO, "configs", "*.py"))])  # dist_keras.configs
# tools/NAME, or configs/NAME.py: paths in a checkout, absent from a wheel
# (whose configs are the package dist_keras.configs, found by name).
REPO_ONLY = re.compile(r"(?<![\w./-])(?:tools/|configs/\w+\.py)")


def _docstrings(tree) -> set:
  """The docstring nodes of `tree` a user does not read as output: every
  one, but a module's docstring when the module reads its own __doc__
  (train.py's --help, the launcher's description)."""
  prints_its_doc = any(isinstance(n, ast.Name) and n.id == "__doc__"
                       for n in ast.walk(tree))
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and not (isinstance(node, ast.Module) and prints_its_doc)):
        found.add(first.value)
  return found


def repository_paths(source: str) -> list:
  """(line, path) of each repository-only path in `source`'s strings
  (comments and docstrings aside: they are read with the source)."""
  tree = ast.parse(source)
  skip = _docstrings(tree)
  return [(node.lineno, found.group(0))
          for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and node not in skip
          for found in REPO_ONLY.finditer(node.value)]


@pytest.mark.parametrize("path", MODULES,
                         ids=lambda p: os.path.relpath(p, REPO))
def test_no_message_names_a_repository_only_file(path):
  with open(path, encoding="utf-8") as f:
    assert repository_paths(f.read()) == []


def test_the_scan_sees_messages_and_printed_docstrings_only():
  source = '''"""Run tools/a.py (a docstring)."""
# tools/b.py in a comment
def f(x):
  """See configs/base.py."""
  raise ValueError(f"{x}: run tools/c.py, see configs/base.py")
'''
  assert repository_paths(source) == [(5, "tools/"), (5, "configs/base.py")]
  # The same module docstring, printed as its --help.
  assert repository_paths(source + "HELP = __doc__\n") == [
      (1, "tools/"), (5, "tools/"), (5, "configs/base.py")]
  assert not repository_paths('X = "dist_keras/configs/base.py, my_tools/x"')
