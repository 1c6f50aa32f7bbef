"""The package's layering: imports point down, never up, and form no cycle.

Read from the source (no import of dist_keras): entry -> assembly ->
training -> distribution -> contract / data / models / measurement ->
utilities. A module may import a lower layer, or a module of its own
sub-package; nothing else.
"""
import ast
import glob
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Module name prefix -> layer; the longest matching prefix wins.
LAYERS = {
    "dist_keras.errors": 0, "dist_keras.terminal": 0, "dist_keras.catalog": 0,
    "dist_keras.signals": 0,
    "dist_keras.quiet": 1, "dist_keras.validate": 1, "dist_keras.disk": 1,
    "dist_keras.tensorboard_events": 1, "dist_keras.configs": 1,
    "dist_keras.commands": 1, "dist_keras.installation": 1,
    "dist_keras.origins": 1,
    "dist_keras.contract": 2, "dist_keras.data": 2, "dist_keras.models": 2,
    "dist_keras.measure": 2,
    "dist_keras.distribute": 3,
    "dist_keras.training": 4,
    "dist_keras.registry": 5,
    "dist_keras.api": 6,
    "dist_keras.train": 7, "dist_keras.launch": 7,
    "dist_keras.prepare_data": 7, "dist_keras": 7,
}


def _modules() -> dict:
  """{module name: file} for dist_keras/ and configs/ (dist_keras.configs)."""
  out = {}
  for path in glob.glob(os.path.join(REPO, "dist_keras", "**", "*.py"),
                        recursive=True):
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    out[rel.removesuffix(".__init__")] = path
  for path in glob.glob(os.path.join(REPO, "configs", "*.py")):
    name = os.path.basename(path)[:-3]
    out["dist_keras.configs" + ("" if name == "__init__" else f".{name}")] = (
        path)
  return out


def _imports(path: str, modules) -> set:
  """The dist_keras modules `path` imports (anywhere in the file)."""
  found = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [f"{node.module}.{a.name}" for a in node.names]
    else:
      continue
    for name in names:
      # `from dist_keras import data` names a module; `from x import f`
      # names its module x.
      while name and name not in modules:
        name = name.rpartition(".")[0]
      if name.startswith("dist_keras"):
        found.add(name)
  return found


def _layer(module: str) -> int:
  prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")),
               key=len)
  return LAYERS[prefix]


def _package(module: str) -> str:
  parts = module.split(".")
  return ".".join(parts[:2]) if len(parts) > 2 else module


def _graph():
  modules = _modules()
  return {m: _imports(path, modules) - {m} for m, path in modules.items()}


def test_every_module_has_a_layer():
  for module in _graph():
    assert _layer(module) is not None, module


def test_imports_point_down_or_stay_in_their_sub_package():
  upward = []
  for module, imported in _graph().items():
    for target in imported:
      same_package = _package(module) == _package(target) != "dist_keras"
      if not same_package and _layer(target) >= _layer(module) and not (
          module == "dist_keras" and target != "dist_keras"):
        upward.append(f"{module} (layer {_layer(module)}) imports {target} "
                      f"(layer {_layer(target)})")
  assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles():
  graph = _graph()
  state = {}

  def visit(module, path):
    if state.get(module) == "done":
      return
    if state.get(module) == "open":
      cycle = path[path.index(module):] + [module]
      pytest.fail("import cycle: " + " -> ".join(cycle))
    state[module] = "open"
    for target in sorted(graph.get(module, ())):
      # A package's __init__ importing its own modules is how Python
      # packages work, not a cycle of concerns.
      if not target.startswith(module + "."):
        visit(target, path + [module])
    state[module] = "done"

  for module in sorted(graph):
    visit(module, [])


def test_the_checker_sees_an_upward_import():
  modules = {"dist_keras.measure.timing": "", "dist_keras.training.loop": ""}
  source = "from dist_keras.training import loop\n"
  path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "layers_probe.py")
  with open(path, "w", encoding="utf-8") as f:
    f.write(source)
  try:
    assert _imports(path, modules) == {"dist_keras.training.loop"}
  finally:
    os.remove(path)
  assert _layer("dist_keras.training.loop") > _layer("dist_keras.measure.timing")
