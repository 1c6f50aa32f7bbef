"""The run's folder: what is written there, atomically, and by whom.

Only the chief writes. Files appear whole or not at all (write to a
temporary name, then rename), so a crash never leaves half a summary.json.
Paths go through tf.io.gfile so a gs:// workdir works too.
"""
import contextlib
import fcntl
import json
import os

import tensorflow as tf

from dist_keras import disk, validate
from dist_keras.contract import saving
from dist_keras.errors import UserError, WorkdirRemoved

CONFIG_JSON = disk.CONFIG_JSON
SUMMARY_JSON = "summary.json"
MODEL_FILE = saving.WHOLE  # model.keras
WEIGHTS_FILE = saving.WEIGHTS  # Its weights, where Keras cannot save it.
CHECKPOINTS = disk.CHECKPOINTS


def prepare(workdir: str) -> str | None:
  """Creates `workdir` and holds it for this process, or raises UserError
  saying why it cannot be used; returns what it created (the outermost
  new folder, or the lock file in a folder that had none; None: nothing),
  which release() removes when the run wrote nothing else there.

  The run's first touch of the workdir: before anything reads it (a
  checkpoint another run is writing must not be taken for a damaged one,
  or for another model's) or writes it. Raises NoSpace or NoWriteAccess
  (disk.py) for a full or read-only disk, leaving nothing there."""
  disk.check_rerun(workdir)  # (The command line's, before TF.)
  validate.workdir(workdir)
  created = _new_part(workdir)
  try:
    _check(workdir)
  except BaseException:
    _remove_unused(created)  # A folder it made, empty.
    raise
  _hold(workdir)
  key = os.path.abspath(workdir)
  _CREATED[key] = created
  if created in (None, os.path.join(key, _LOCK_FILE)):  # There before.
    _FOUND[key] = _as_found(workdir)
  return created


def _check(workdir: str) -> None:
  """Makes `workdir` and checks that the run can write there."""
  probe = os.path.join(workdir, ".write_test")
  try:
    tf.io.gfile.makedirs(workdir)
    try:
      with tf.io.gfile.GFile(probe, "w") as f:
        f.write("ok")
    finally:  # A full disk makes the file, then fails writing it.
      if tf.io.gfile.exists(probe):
        tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise disk.fault(e, workdir) or UserError(
        f"{validate.named_workdir(workdir)} is not writable "
        f"({type(e).__name__}); pass a "
        "folder you can write to.") from e
  for name, folder in [(CHECKPOINTS, True), (CONFIG_JSON, False),
                       (SUMMARY_JSON, False), (MODEL_FILE, False),
                       (WEIGHTS_FILE, False)]:
    path = os.path.join(workdir, name)
    if tf.io.gfile.exists(path) and tf.io.gfile.isdir(path) != folder:
      raise UserError(
          f"{validate.named_workdir(workdir)} holds {name} as a "
          f"{'file' if folder else 'folder'}, where the run writes its "
          f"{'checkpoints folder' if folder else name}; move it away.")


def _new_part(workdir: str) -> str | None:
  """The outermost folder of `workdir` that does not exist yet, or its
  lock file if the folder exists without one; None if both exist."""
  if "://" in workdir:  # (No lock file, and no parents to make there.)
    return None if tf.io.gfile.exists(workdir) else workdir
  path = os.path.abspath(workdir)
  if os.path.exists(path):
    lock = os.path.join(path, _LOCK_FILE)
    return None if os.path.exists(lock) else lock
  while not os.path.exists(os.path.dirname(path)):
    path = os.path.dirname(path)
  return path


# Workdirs this process holds: {absolute path: its open lock file}. One
# process may train in the same workdir again (a rerun from Python); two
# processes at once would interleave checkpoints, config.json, summary.json
# and model.keras, and both report success.
_HELD = {}
# Per held workdir: what prepare() created; whether the run ended with
# nothing worth keeping before its first checkpoint (refused()); and, in
# a folder there before, what such a run puts back (_as_found).
_CREATED, _REFUSED, _FOUND = {}, set(), {}
_EVENTS = "events.out.tfevents."
_LOCK_FILE = ".lock"
# What a run writes before its first checkpoint, and nothing else.
_STARTING_FILES = (_LOCK_FILE, CONFIG_JSON, _EVENTS)


def _hold(workdir: str) -> None:
  """An exclusive lock on a local `workdir` (the kernel drops it when the
  process ends, however it ends); UserError if another process has it."""
  key = os.path.abspath(workdir)
  if "://" in workdir or key in _HELD:  # (gs:// has no locks.)
    return
  lock = open(os.path.join(workdir, _LOCK_FILE), "a+", encoding="utf-8")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    lock.seek(0)
    holder = lock.read().strip() or "unknown"
    lock.close()
    raise UserError(
        f"{validate.named_workdir(workdir)} is in use by another run "
        f"(process {holder}); wait for it to end, or pass another "
        f"{validate.workdir_option()}.") from None
  lock.seek(0)
  lock.truncate()
  lock.write(f"{os.getpid()}\n")
  lock.flush()
  _HELD[key] = lock


def check_held(workdir: str, saved: str) -> None:
  """Raises WorkdirRemoved if the workdir this process holds was removed
  or moved away since prepare() (its lock file is not the one held):
  config.json and TensorBoard's events went with it (the writer goes on
  into the removed file), and no lock keeps a second run out. The run
  stops there rather than end "done" without them; `saved`, the
  checkpoint just saved, made the folder anew: a rerun resumes from it."""
  lock = _HELD.get(os.path.abspath(workdir))
  if lock is None:  # (gs://: no lock.)
    return
  try:
    same = os.path.samestat(os.fstat(lock.fileno()), os.stat(lock.name))
  except FileNotFoundError:
    same = False
  if not same:
    raise WorkdirRemoved(
        f"{validate.named_workdir(workdir)} was removed or moved away while "
        "the run went "
        f"(with its {_LOCK_FILE}, config.json and TensorBoard's events): "
        f"stopped after saving {saved} in it anew; rerun the same command "
        "to resume from there, or remove the folder if it was meant to go.")


def refused(workdir: str) -> None:
  """The run ended before its first checkpoint with nothing worth keeping
  (api._nothing_kept): release() removes what it wrote (config.json,
  TensorBoard's events) with the folder prepare() created, or puts back
  the config.json a folder there before held."""
  _REFUSED.add(os.path.abspath(workdir))


def release(workdir: str, started: bool = True) -> None:
  """Lets go of a workdir prepare() held. What prepare created (it keeps
  that) goes when the run did not start (`started` False: a bad model or
  dataset leaves no folder behind) and held nothing else, or when it was
  refused(). (Only while this process holds the lock: never another
  run's.)"""
  key = os.path.abspath(workdir)
  lock, created = _HELD.pop(key, None), _CREATED.pop(key, None)
  refused_run, found = key in _REFUSED, _FOUND.pop(key, None)
  _REFUSED.discard(key)
  if lock is None:
    return
  try:
    if refused_run and found is not None:
      _put_back(workdir, *found)
    if refused_run or not started:
      _remove_unused(created, starting_files=refused_run)
  finally:
    lock.close()


def _as_found(workdir: str) -> tuple | None:
  """(config.json's bytes, None for none; the TensorBoard event files), or
  None where they cannot be read (then a refused run leaves them)."""
  path = os.path.join(workdir, CONFIG_JSON)
  try:
    with contextlib.ExitStack() as stack:
      return (stack.enter_context(tf.io.gfile.GFile(path, "rb")).read()
              if tf.io.gfile.exists(path) else None), _event_files(workdir)
  except (tf.errors.OpError, OSError):
    return None


def _event_files(workdir: str) -> frozenset:
  return frozenset(name for name in tf.io.gfile.listdir(workdir)
                   if name.startswith(_EVENTS))


def _put_back(workdir: str, config: bytes | None, events: frozenset) -> None:
  """`workdir` as a refused run found it: its event files removed, the
  config.json it replaced written back (or its own removed)."""
  path = os.path.join(workdir, CONFIG_JSON)
  try:  # (A full disk leaves the run's own: the run's error is the one said.)
    for name in _event_files(workdir) - events:
      tf.io.gfile.remove(os.path.join(workdir, name))
    if config is not None:
      with (_replacing(path + ".tmp", path),
            tf.io.gfile.GFile(path + ".tmp", "wb") as f):
        f.write(config)
    elif tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  except (tf.errors.OpError, OSError):
    pass


def _remove_unused(created: str | None, starting_files=False) -> None:
  """Removes `created` if it holds only locks (or, with `starting_files`,
  only what a run writes before its first checkpoint)."""
  names = (_STARTING_FILES if starting_files and created
           and tf.io.gfile.isdir(created) else (_LOCK_FILE,))
  if not created or not _holds_only(created, names):
    return
  if tf.io.gfile.isdir(created):
    tf.io.gfile.rmtree(created)
  else:
    tf.io.gfile.remove(created)


def _holds_only(path: str, names: tuple) -> bool:
  """Whether `path` holds nothing but files whose names start with one of
  `names` (in folders of their own: none else), or is one."""
  if not tf.io.gfile.isdir(path):
    return (os.path.basename(path).startswith(names)
            and tf.io.gfile.exists(path))
  return all(name.startswith(names) for _, _, found in tf.io.gfile.walk(path)
             for name in found)


def write_json(workdir: str, name: str, data: dict) -> str:
  """Writes `data` as `workdir/name`, atomically; returns the path."""
  path = os.path.join(workdir, name)
  text = json.dumps(data, indent=2, sort_keys=True) + "\n"  # Fails first.
  tmp = path + ".tmp"
  with _replacing(tmp, path):
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
  return path


def read_json(workdir: str, name: str):
  """`workdir/name` parsed (tf.errors.OpError, OSError or ValueError if it
  cannot be read or is not JSON)."""
  with tf.io.gfile.GFile(os.path.join(workdir, name)) as f:
    return json.load(f)


def model_file(model) -> tuple[str, str | None]:
  """The file the run's end saves `model` as: MODEL_FILE, or WEIGHTS_FILE
  where Keras cannot serialize the model (contract/saving.py); and the
  line that says so at the run's start (None for model.keras)."""
  why = saving.unsavable(model)
  if why is None:
    return MODEL_FILE, None
  return WEIGHTS_FILE, saving.weights_only_line(model, why)


def save_model(workdir: str, model, name: str = MODEL_FILE) -> str:
  """Saves `model` as `workdir/name`, atomically: MODEL_FILE whole
  (model.save), WEIGHTS_FILE its weights only (model.save_weights). Then
  removes the other file, which an earlier run of another model class in
  this workdir left (not this model's). Returns the path."""
  path = os.path.join(workdir, name)
  # Keras wants the suffix: .keras, or .weights.h5.
  tmp = os.path.join(workdir, "model.tmp." + name.split(".", 1)[1])
  with _replacing(tmp, path):
    if name == WEIGHTS_FILE:
      model.save_weights(tmp)
    else:
      model.save(tmp)
  other = os.path.join(workdir, MODEL_FILE if name == WEIGHTS_FILE
                       else WEIGHTS_FILE)
  if tf.io.gfile.exists(other):
    tf.io.gfile.remove(other)
  return path


@contextlib.contextmanager
def _replacing(tmp: str, path: str):
  """Renames `tmp` over `path` once the block has written it whole; a block
  that fails leaves `path` as it was and removes what it wrote of `tmp`."""
  try:
    yield
    tf.io.gfile.rename(tmp, path, overwrite=True)
  except BaseException as e:
    if isinstance(e, OSError) and e.filename is None:
      e.filename = tmp  # Keras' model.save names none: the line would not.
    if tf.io.gfile.exists(tmp):
      tf.io.gfile.remove(tmp)
    raise
