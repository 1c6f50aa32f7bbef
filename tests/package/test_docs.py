"""README.md and docs/*.md: every relative link resolves, and the README
stays a page; every file the code's docstrings and comments (and README's
Layout) name exists, so a rename cannot leave them pointing nowhere; a
docstring's command lines keep their line breaks.

A relative link `[text](path)` or `![alt](path)` must name an existing file
or folder (relative to the page that holds it), and an anchor `#anchor`,
in the same page or in another .md page, must be the slug of one of that
page's headings, as GitHub makes them. Links to http(s) and other schemes,
and anything inside code (fenced blocks, inline `spans`), are not checked.
No TensorFlow import here (the checks read text only).
"""
import ast
import glob
import os
import re
import urllib.parse

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
README_MAX_LINES = 250
PAGES = [README, *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), text with one level of nested [...];
# an optional "title" after the target.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?"
                   r"(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
_HTML_ID = re.compile(r"<a\s[^>]*(?:id|name)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str):
  """(line number, line) outside fenced code blocks."""
  fence = None
  for number, line in enumerate(text.splitlines(), 1):
    match = _FENCE.match(line)
    if match:
      if fence is None:
        fence = match.group(1)
      elif match.group(1) == fence:
        fence = None
      continue
    if fence is None:
      yield number, line


def slug(heading: str) -> str:
  """GitHub's anchor for a heading's text: the rendered text (links to their
  text, no code or emphasis markers), lowercased, every character but
  letters, digits, `_`, `-` and spaces dropped, spaces to hyphens."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
  text = text.replace("`", "").replace("*", "")
  text = re.sub(r"<[^>]+>", "", text).strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  """Every anchor of a page: its headings' slugs (a repeated slug gets -1,
  -2, ...) and explicit <a id=...> / <a name=...>."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  seen, found = {}, set()
  for _, line in prose_lines(text):
    found.update(_HTML_ID.findall(line))
    match = _HEADING.match(line)
    if not match:
      continue
    base = slug(match.group(2))
    count = seen.get(base, 0)
    seen[base] = count + 1
    found.add(base if count == 0 else f"{base}-{count}")
  return found


def links(path: str):
  """(line number, target) of every link in `path`'s prose."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  for number, line in prose_lines(text):
    line = _CODE_SPAN.sub("", line)
    definition = _REF_DEF.match(line)
    if definition:
      yield number, definition.group(1)
      continue
    for match in _LINK.finditer(line):
      yield number, match.group(1)


def broken_links(path: str) -> list[str]:
  """'page:line: target (why)' for each relative link of `path` that does
  not resolve."""
  problems = []
  where = os.path.relpath(path, REPO)
  for number, target in links(path):
    if not target or _SCHEME.match(target) or target.startswith("//"):
      continue
    file_part, _, anchor = target.partition("#")
    file_part = urllib.parse.unquote(file_part)
    resolved = (os.path.normpath(os.path.join(os.path.dirname(path),
                                              file_part))
                if file_part else path)
    if not os.path.exists(resolved):
      problems.append(f"{where}:{number}: {target} (no such file)")
      continue
    if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
      if urllib.parse.unquote(anchor) not in anchors(resolved):
        problems.append(f"{where}:{number}: {target} (no heading "
                        f"#{anchor} in {os.path.relpath(resolved, REPO)})")
  return problems


@pytest.mark.parametrize("page", PAGES,
                         ids=[os.path.relpath(p, REPO) for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
  assert not broken_links(page), "\n".join(broken_links(page))


def test_readme_is_at_most_250_lines():
  with open(README, encoding="utf-8") as f:
    lines = len(f.read().splitlines())
  assert lines <= README_MAX_LINES, (
      f"README.md has {lines} lines; keep it <= {README_MAX_LINES} and move "
      "the rest to a page in docs/")


def test_slug_follows_github():
  assert slug("Real datasets (TFDS)") == "real-datasets-tfds"
  assert (slug("Synthetic data: compute + sync without the input pipeline")
          == "synthetic-data-compute--sync-without-the-input-pipeline")
  assert slug("Against Keras' own `fit`") == "against-keras-own-fit"
  assert slug("`tools/scaling_model.py`") == "toolsscaling_modelpy"
  assert slug("[Links](x.md) and **bold**") == "links-and-bold"


def test_a_broken_link_or_anchor_is_reported(tmp_path):
  (tmp_path / "other.md").write_text("# Other\n\n## Twice\n\n## Twice\n")
  page = tmp_path / "page.md"
  page.write_text(
      "# Page\n\n## Here\n\n"
      "[ok](other.md) [ok](other.md#twice-1) [ok](#here) "
      "[web](https://example.com/nowhere) `[code](nowhere.md)`\n\n"
      "```\n[fenced](nowhere.md)\n```\n\n"
      "[gone](nowhere.md) [bad anchor](other.md#thrice) [self](#there)\n"
      "![image](missing.png)\n")
  problems = broken_links(str(page))
  assert len(problems) == 4, problems
  assert [p.split(": ", 1)[1].split(" ")[0] for p in problems] == [
      "nowhere.md", "other.md#thrice", "#there", "missing.png"]


# A file named in the package's docstrings and comments, in the tools' and
# configs', or in README's Layout block: `name.py` or `folder/name.py`. A
# placeholder (PATH.py, NAME.py) and TensorFlow's or Keras' own sources are
# not this repository's files.
_NAMED_FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[A-Za-z_]\w*\.py)\b")
_NOT_OURS = re.compile(r"^(?:tensorflow|keras)/|(?:^|/)[A-Z_]+\.py$")
_NAMING_SOURCES = ("dist_keras", "tools", "configs", "examples")


def _repo_files() -> set:
  """Every path in the repository's source folders and its top-level
  files (setup.py), relative to it."""
  found = {name for name in os.listdir(REPO)
           if os.path.isfile(os.path.join(REPO, name))}
  for folder in (*_NAMING_SOURCES, "tests"):
    for root, dirs, files in os.walk(os.path.join(REPO, folder)):
      dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
      for name in files:
        found.add(os.path.relpath(os.path.join(root, name), REPO))
  return found


def _layout_block(text: str) -> str:
  """The fenced block under README's `## Layout` heading."""
  section = text.split("\n## Layout", 1)[-1]
  return section.split("```")[1] if "```" in section else ""


def unknown_file_names(text: str, files: set) -> list:
  """The `*.py` names in `text` that are no file in `files`: a bare name
  must be some file's name, a name with folders must end some file's path."""
  missing = []
  for name in _NAMED_FILE.findall(text):
    if _NOT_OURS.search(name):
      continue
    if not any(path == name or path.endswith("/" + name) for path in files):
      missing.append(name)
  return missing


def test_every_file_named_in_code_and_readme_layout_exists():
  files = _repo_files()
  problems = []
  sources = [os.path.join(REPO, path) for path in sorted(files)
             if path.endswith(".py") and path.startswith(_NAMING_SOURCES)]
  for path in sources:
    with open(path, encoding="utf-8") as f:
      for name in unknown_file_names(f.read(), files):
        problems.append(f"{os.path.relpath(path, REPO)}: {name}")
  with open(README, encoding="utf-8") as f:
    for name in unknown_file_names(_layout_block(f.read()), files):
      problems.append(f"README.md (Layout): {name}")
  assert not problems, "files named that do not exist (renamed?):\n" + (
      "\n".join(problems))


def test_a_renamed_file_is_reported():
  files = {"dist_keras/training/steps.py", "dist_keras/api.py"}
  text = ("steps.py, training/steps.py and api.py exist; step.py and "
          "distribute/input.py do not; PATH.py and tensorflow/python/x.py "
          "are not ours; training/steps.pyc is no .py name")
  assert unknown_file_names(text, files) == ["step.py", "distribute/input.py"]


# A line ending in one backslash (an odd count) inside a string's source.
_CONTINUED = re.compile(r"(?<!\\)(?:\\\\)*\\\n")


def joined_docstring_lines(source: str) -> list[int]:
  """Line numbers of the docstrings whose source continues a line with a
  backslash: in a non-raw string it joins the two lines, as `--help`
  printed train.py's usage ("--workdir=DIR       [--config.train...]")."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      doc = node.body[0] if node.body else None
      if (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
          and isinstance(doc.value.value, str)):
        text = ast.get_source_segment(source, doc.value)
        if not text.startswith(("r", "R")) and _CONTINUED.search(text):
          found.append(doc.lineno)
  return found


def test_docstrings_keep_their_line_breaks():
  joined = []
  for path in sorted(_repo_files()):
    if path.endswith(".py") and path.startswith(_NAMING_SOURCES):
      with open(os.path.join(REPO, path), encoding="utf-8") as f:
        joined += [f"{path}:{n}" for n in joined_docstring_lines(f.read())]
  assert not joined, "write \\\\ for a backslash at a line's end: " + (
      ", ".join(joined))


def test_a_joined_docstring_line_is_reported():
  source = ('"""Usage:\n  run --a \\\n      --b\n"""\n'
            'def f():\n  r"""raw: \\\n kept"""\n'
            'def g():\n  """escaped: \\\\\n kept"""\n')
  assert joined_docstring_lines(source) == [1]


# `pip install dist-keras` (or dist_keras, any extra) fetches PyPI's project
# of that name, another one (Spark and Theano, module `distkeras`): advice
# installs the checkout (`pip install -e ".[cpu]"`) or the packages by their
# own names (installation.install).
_PIP_INSTALL = re.compile(
    r"pip3?[ \t]+install((?:[ \t]+(?:\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`()|;&]+))+)")


def installs_pypi_dist_keras(text: str) -> list[str]:
  """The `pip install` commands in `text` that name the package dist-keras
  (PyPI's spelling rules: case, '-', '_' and '.' alike)."""
  found = []
  for match in _PIP_INSTALL.finditer(text):
    for token in re.findall(r"\"[^\"]*\"|'[^']*'|\S+", match.group(1)):
      name = re.split(r"[\[<>=!~;@ ]", token.strip("\"'"))[0]
      if re.sub(r"[-_.]+", "-", name.lower()) == "dist-keras":
        found.append(match.group(0).strip())
  return found


def test_no_advice_installs_pypis_dist_keras():
  files = sorted(p for p in _repo_files()
                 if p.startswith(("dist_keras/", "tools/", "configs/",
                                  "examples/")) or "/" not in p)
  files += [os.path.relpath(p, REPO) for p in PAGES[1:]]
  files += [os.path.relpath(p, REPO) for p in
            glob.glob(os.path.join(REPO, "notebooks", "*.ipynb"))]
  found = []
  for path in files:
    try:
      with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    except UnicodeDecodeError:  # A figure or another binary file.
      continue
    found += [f"{path}: {c}" for c in installs_pypi_dist_keras(text)]
  assert not found, ("PyPI's dist-keras is another project; say "
                     "`pip install -e \".[EXTRA]\"` in the checkout: "
                     + "; ".join(found))


def test_an_install_of_pypis_dist_keras_is_reported():
  text = ('Needs `pip install "dist-keras[cpu,ray]"`.\n'
          "pip install -U Dist_Keras==0.1 numpy\n"
          "pip install -e '.[tpu]' (in dist_keras' checkout)\n"
          'pip install -e ".[cpu,ray]"\n'
          "Not `pip install\n  'dist-keras[cpu]'`: another project.\n")
  assert installs_pypi_dist_keras(text) == [
      'pip install "dist-keras[cpu,ray]"',
      "pip install -U Dist_Keras==0.1 numpy"]
