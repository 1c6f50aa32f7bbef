"""What this installation of dist_keras has, and where its lines send a
user: the extra that installs TensorFlow, the private Keras and TensorFlow
attributes dist_keras relies on, the docs page for more. Layer 1: no
TensorFlow import (the command line checks for it before it starts)."""
import contextlib
import importlib.metadata
import importlib.util
import inspect
import shlex

from dist_keras.errors import UserError

# setup.py's name. PyPI's "dist-keras" is another project: advice installs
# packages by their own names (install()).
DISTRIBUTION = "dist-keras"


def check_tensorflow_installed(error=UserError) -> None:
  """Raises `error` saying which extra installs TensorFlow, if it is not:
  TensorFlow is an extra (a Colab or TPU image brings its own build), so
  its absence is an installation choice, not a bug."""
  if importlib.util.find_spec("tensorflow") is None:
    raise error(
        f"dist_keras needs TensorFlow, which is installed through an extra: "
        f"{install('cpu')} (CPU), {install('cuda')} (NVIDIA GPUs) or "
        f"{install('tpu')} (Cloud TPU VMs); Colab images have it.")


def install(extra: str) -> str:
  """The command that installs dist_keras' `extra` (cpu, cuda, tpu): its
  packages as this installation declares them. Not `pip install
  'dist-keras[cpu]'`: that name on PyPI is another project."""
  try:
    required = importlib.metadata.requires(DISTRIBUTION) or []
  except importlib.metadata.PackageNotFoundError:  # A checkout on the path.
    return f"pip install -e '.[{extra}]' (in dist_keras' checkout)"
  marker = f'extra == "{extra}"'
  packages = [r.split(";")[0].strip() for r in required if marker in r]
  return "pip install " + " ".join(shlex.quote(p) for p in packages)


def see_docs(page: str, topic: str, section: str) -> str:
  """Where a line sends its reader for more: `topic`, on docs page `page`
  (e.g. "mfu.md"), which the README's `section` links to. The wheel ships
  no docs/ folder and the project declares no URL; the README is the
  package's description (PyPI) and the checkout's front page."""
  return f'see {topic}: {page}, linked from the README\'s "{section}"'


def require(obj, name: str, what: str, where: str):
  """`obj.name`: a private attribute of Keras or TensorFlow (of a module,
  or of an object) that dist_keras module `where` relies on. One line
  naming it where this release has none, not an AttributeError mid-run."""
  value = getattr(obj, name, None)
  if value is None:
    module = inspect.ismodule(obj)
    owner = obj.__name__ if module else type(obj).__name__
    origins = [obj.__name__] if module else [
        c.__module__ for c in type(obj).__mro__]
    library = ("Keras" if any(o.startswith("keras") for o in origins)
               else "TensorFlow")
    raise RuntimeError(
        f"{owner} has no {name} ({what}): this {library} release changed it;"
        f" dist_keras needs updating ({where}).")
  return value


def layers_in(layer, include_self: bool) -> list:
  """Every layer inside Keras layer or model `layer`, each once (a shared
  one too), at any depth: a nested model's layers and a subclassed
  layer's own sublayers as well as the model's; `layer` itself first with
  `include_self`. In Keras' own order, the same in every process for the
  same model (the checkpoints number stateful RNNs' states in it).

  Through Keras' private Layer._flatten_layers (recursive=True): Keras 3
  has no public walk (`model.layers` stops at a nested model, and holds no
  subclassed layer's sublayers). tests/training/test_keras_internals.py
  checks what it yields."""
  walk = require(layer, "_flatten_layers", "the walk over a model's layers",
                 "dist_keras/installation.py")
  return walk(include_self=include_self, recursive=True)


@contextlib.contextmanager
def keras_name_scopes_kept():
  """Keras' name-scope stack (a private global of keras.src) as it was
  before the block, whatever the block raised. Keras pushes a layer's
  scope before TensorFlow refuses its name (a class `_Net`'s "__net" at a
  graph's outermost scope: contract/traced_limits.py), and nothing pops
  it: every later variable of the process would be named under it (a
  notebook's next model: "__net/sequential/dense/kernel"). Around each
  trace dist_keras makes that may fail, and around the whole run."""
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  where = "dist_keras/installation.py"
  get = require(global_state, "get_global_attribute", "Keras' state", where)
  put = require(global_state, "set_global_attribute", "Keras' state", where)
  stack = get("name_scope_stack")
  kept = None if stack is None else list(stack)
  try:
    yield
  finally:
    if stack is not None:
      stack[:] = kept
    put("name_scope_stack", stack)
