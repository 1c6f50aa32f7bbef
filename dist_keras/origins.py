"""Whose code an error came from: a user's function (model_fn, dataset_fn,
marked by raised_in), their input pipeline's records, an op their own
code made in the step, or dist_keras (unexpected: a bug's word).

The answer decides the command line's one line (where, and whether it
says "unexpected") and, on a cluster, whether a worker tells its peers
(users_own) or leaves them to find it lost and restart into it.
"""
import contextlib
import functools
import os
import re
import sys
import sysconfig

from dist_keras import errors

# A TF runtime error's frames ("[[{{node CheckNumerics}}]]", then the calls
# around it): one an input pipeline's iterator ran failed in tf.data, on
# the dataset dataset_fn returned (a corrupt record, a file gone, a bad
# image to decode, the user's own check in a map), not in a step's math.
_FRAME = re.compile(r"\[\[([^\]]*)\]\]")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
# What a rerun meets again in the same data; a transient read (Unavailable,
# DeadlineExceeded) stays unexpected: a restart may get past it.
_DATA_FAULTS = ("InvalidArgumentError", "DataLossError", "NotFoundError")
IN_PIPELINE = "raised in the input pipeline dataset_fn returned"
# Where TF says a failing op was made as the step was traced: a header,
# then a frame a line, innermost last ("<stack traces unavailable>" for
# the ops of a tf.data function).
_DEFINED_AT = re.compile(r"^Detected at node (\S+) defined at")
_FILE_LINE = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)')
# Whose frames stand between the code that made an op and the op (a
# layer's __call__, a loss wrapper, tf.debugging's own): passed over.
_LIBRARIES = ("tensorflow", "keras", "tf_keras", "absl", "numpy", "optree",
              "tree")
_OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
# Installed packages sit under Python's own folder where no virtualenv
# separates them (and a virtualenv's platstdlib holds them): not Python's.
_INSTALLED = (f"{os.sep}site-packages{os.sep}",
              f"{os.sep}dist-packages{os.sep}")
_IN = "raised in "
MADE_AT = "raised by the op made at "


def unexpected(error: Exception, said=()) -> str:
  """One line for an error no check anticipated: its type and what
  happened (a TF runtime error's cause, not its "Graph execution error:"),
  then in brackets where, if a user's function (raised_in), input
  pipeline or an op their code made (_said_where) raised it, and what
  `said` adds."""
  line = errors.first_line(error)
  if line.startswith(errors.BOILERPLATE):
    line = errors.cause(str(error))
  said = [*_said_where(error), *said]
  return f"{type(error).__name__}: {line}" + (f" ({'; '.join(said)})"
                                              if said else "")


@contextlib.contextmanager
def raised_in(where: str):
  """Marks an error a user's function raises with `where` (a note, which a
  traceback shows and unexpected() says); the error itself passes
  unchanged, so dist_keras.fit's caller catches their own exception."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if not isinstance(e, errors.KNOWN) and not _where(e):
      e.add_note(_IN + where)
    raise


def users_own(error: BaseException) -> bool:
  """Whether `error` is a user's function's own error that no check of
  dist_keras knows (said as `unexpected` says it, exit 1): a worker of a
  cluster tells its peers of it, as of its UserError."""
  return (isinstance(error, Exception)
          and not isinstance(error, errors.KNOWN) and in_users_code(error))


def in_users_code(error: Exception) -> bool:
  """Whether a user's function raised `error`: raised_in marked it, or a
  function a dataset's map (filter, ...) runs did, or their pipeline
  failed on a record, or an op their own code made failed its check, as
  the run went."""
  return bool(_said_where(error)
              or errors.IN_DATASET_FN.search(str(error)))


def _said_where(error: Exception) -> list:
  """Where a user's function, input pipeline or op raised `error`, as
  unexpected() says it: raised_in's last note, MADE_AT or IN_PIPELINE ([]
  when a dataset's function raised it: its line says so, "in a tf.data
  function"). An op made as the step was traced has frames: the user's
  (MADE_AT) or ours (unexpected, whatever iterator a root error passed
  through); tf.data's own ops have none, or are the iterator's."""
  where = _where(error)[-1:]
  if where or errors.IN_DATASET_FN.search(str(error)):
    return where
  node, frames = _failed_op(error)
  made_at = _innermost_of_ours_or_users(frames)
  if (made_at and not made_at[0].startswith(_OURS)
      and type(error).__name__ == "InvalidArgumentError"):
    return [MADE_AT + "{}:{} in {}".format(*made_at)]
  if _in_pipeline(error) and (not frames or "IteratorGetNext" in node):
    return [IN_PIPELINE]
  return []


def _first_root(error: Exception) -> str:
  """The text of `error` up to its second root error."""
  return str(error).split("\n  (1) ")[0]


def _in_pipeline(error: Exception) -> bool:
  """Whether `error` is a data fault (_DATA_FAULTS) that TF raised inside
  an input pipeline's iterator: its first root error's frames."""
  if type(error).__name__ not in _DATA_FAULTS:
    return False
  return any("IteratorGetNext" in frame
             for frame in _FRAME.findall(_first_root(error)))


def _failed_op(error: Exception) -> tuple:
  """(the first root error's failing node, [(path, line, function)] where
  TF says it was made, outermost first: [] for tf.data's own ops)."""
  node = _NODE.search(_first_root(error).rpartition("root error(s)")[2])
  node = node.group(1) if node else ""
  return node, _defined_at(str(error), node or None)


def _innermost_of_ours_or_users(frames) -> tuple | None:
  """The innermost of `frames` past TF's, Keras' and Python's own: the
  code that made the op (a user's layer, loss or train_step, a
  check_numerics or tf.debugging assertion there; or dist_keras)."""
  return next((frame for frame in reversed(frames)
               if not _in_library(frame[0])), None)


def _defined_at(text: str, node: str | None) -> list:
  """[(path, line, function)] of the frames TF gives for `node` (the first
  block, where the error names no node), outermost first (a blank line
  between frames, as TF 2.21 writes them)."""
  frames, taking = [], False
  for line in filter(str.strip, text.splitlines()):
    header = _DEFINED_AT.match(line)
    if header:
      if frames:
        break
      taking = node is None or header.group(1) == node
      continue
    frame = _FILE_LINE.match(line) if taking else None
    if frame:
      frames.append(frame.groups())
    elif taking and frames:
      break
  return frames


def users(path: str) -> bool:
  """Whether a frame in file `path` is a user's code: neither dist_keras'
  nor a library's (_in_library). training/random_ops.py places draws so."""
  return not (path.startswith(_OURS) or _in_library(path))


def _in_library(path: str) -> bool:
  """Whether `path` is in a library loaded (_LIBRARIES) or in Python's own
  modules (not the packages installed under them), or a "<frozen ...>"
  frame's."""
  packages, python = _folders(
      tuple(name for name in _LIBRARIES if name in sys.modules))
  return path.startswith(packages) or (
      path.startswith(python) and not any(d in path for d in _INSTALLED))


@functools.lru_cache(maxsize=None)
def _folders(loaded: tuple) -> tuple:
  """(the folders of the libraries `loaded` and "<", Python's own), each
  ending in a separator: read once per set of libraries loaded
  (sysconfig alone takes ~0.2 ms, and random_ops asks per frame)."""
  packages = ("<", *(
      os.path.join(os.path.dirname(os.path.abspath(
          sys.modules[name].__file__)), "")
      for name in loaded if getattr(sys.modules[name], "__file__", None)))
  return packages, tuple(os.path.join(sysconfig.get_paths()[k], "")
                         for k in ("stdlib", "platstdlib"))


def _where(error: Exception) -> list:
  """raised_in's notes on `error`."""
  return [n for n in getattr(error, "__notes__", ()) if n.startswith(_IN)]
