"""The package's code stays readable in one sitting: modules of at most 300
lines, functions of at most 60 lines (docstring included) and 6 parameters,
and comments that say why, not which issue asked (read from the source)."""
import ast
import glob
import io
import os
import re
import tokenize

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(glob.glob(os.path.join(REPO, "dist_keras", "**", "*.py"),
                           recursive=True))
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 300, 60, 6
# "issue 27", "(#27)", "#27:", not a GitHub reference (keras-team/keras#20585).
ISSUE = re.compile(r"(?i)\bissues? #?\d+|(?<![\w/-])#\d+\b")


def _source(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _name(path):
  return os.path.relpath(path, REPO)


def test_modules_are_found():
  assert len(MODULES) > 40


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_is_short(path):
  assert _source(path).count("\n") <= MAX_MODULE_LINES


def _parameters(node):
  args = node.args
  names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
  return [n for n in names if n not in ("self", "cls")]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_functions_are_short_and_take_few_parameters(path):
  long = []
  for node in ast.walk(ast.parse(_source(path))):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      lines = node.end_lineno - node.lineno + 1
      if lines > MAX_FUNCTION_LINES or len(_parameters(node)) > MAX_PARAMETERS:
        long.append((node.name, lines, _parameters(node)))
  assert not long


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_comments_name_no_issue(path):
  tokens = tokenize.generate_tokens(io.StringIO(_source(path)).readline)
  cited = [(t.start[0], t.string) for t in tokens
           if t.type == tokenize.COMMENT and ISSUE.search(t.string)]
  assert not cited


def test_the_issue_pattern_tells_a_citation_from_a_reference():
  assert ISSUE.search("# Needed for issue 27.")
  assert ISSUE.search("# see #12")
  assert not ISSUE.search("# keras-team/keras#20585 is why")


# What writes to the terminal other than terminal.say: print(), a write or
# flush of sys.stdout/sys.stderr, a traceback printed, os.write to fd 1 or 2.
DIRECT_OUTPUT = re.compile(
    r"^(print|traceback\.print_\w+|"
    r"sys\.(__)?(stdout|stderr)(__)?\.(write|writelines|flush))$")


def _direct_output(source: str) -> list:
  """(line, call) of each write to the terminal that bypasses say."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call):
      continue
    called = ast.unparse(node.func)
    to_fd = (called == "os.write" and node.args
             and ast.unparse(node.args[0]) in ("1", "2"))
    if DIRECT_OUTPUT.match(called) or to_fd:
      found.append((node.lineno, called))
  return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_the_run_prints_through_terminal_say_only(path):
  """A stdout or stderr that fails (EPIPE, ENOSPC, EIO) or was closed must
  never end a run: every line goes through the one guarded function."""
  if _name(path) == os.path.join("dist_keras", "terminal.py"):
    return
  assert not _direct_output(_source(path))


def test_the_output_check_sees_each_way_around_say():
  source = ("import sys, os, traceback\nprint('x')\nsys.stderr.write('x')\n"
            "sys.stdout.flush()\ntraceback.print_exc()\nos.write(2, b'x')\n"
            "terminal.say('x')\nos.write(fd, b'x')\n")
  assert [call for _, call in _direct_output(source)] == [
      "print", "sys.stderr.write", "sys.stdout.flush", "traceback.print_exc",
      "os.write"]
