"""What the installed package says names only what its user has: no
message, and no --help a module prints from its own docstring, names a
file of the repository that the wheel does not ship (tools/..., docs/...
but in a full URL, or a config by its checkout path, configs/base.py).
A line sending its reader to a docs page names the page and the README
section linking to it (installation.see_docs), both checked here. The
wheel ships the launcher and the data preparer as `python -m
dist_keras.launch` and `python -m dist_keras.prepare_data` (read from the
source)."""
import ast
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted([
    *glob.glob(os.path.join(REPO, "dist_keras", "**", "*.py"), recursive=True),
    *glob.glob(os.path.join(REPO, "configs", "*.py"))])  # dist_keras.configs
# tools/NAME, docs/NAME, or configs/NAME.py: paths in a checkout, absent
# from a wheel (whose configs are the package dist_keras.configs, found by
# name); a URL's .../docs/NAME is whole.
REPO_ONLY = re.compile(r"(?<![\w./-])(?:tools/|docs/|configs/\w+\.py)")


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
  assert repository_paths('X = "(see docs/mfu.md)"') == [(1, "docs/")]
  assert not repository_paths(
      'X = "https://github.com/o/r/blob/main/docs/mfu.md#peak"')


def _see_docs_calls():
  """(module, page, section) of each installation.see_docs call in the
  package."""
  for path in MODULES:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call)
          and getattr(node.func, "attr", None) == "see_docs"):
        page, _, section = [a.value for a in node.args]
        yield os.path.relpath(path, REPO), page, section


def test_a_docs_page_named_is_linked_from_the_readme_section_named():
  calls = list(_see_docs_calls())
  assert len(calls) >= 3
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    sections = re.split(r"^## ", f.read(), flags=re.M)
  for module, page, section in calls:
    assert os.path.isfile(os.path.join(REPO, "docs", page)), module
    (text,) = [s for s in sections if s.startswith(section + "\n")]
    assert f"(docs/{page})" in text, (module, page, section)
