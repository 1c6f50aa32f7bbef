"""The files of workdir/checkpoints beside the checkpoints: TensorFlow's
list of them, and what a save cut short (SIGKILL, a lost node) leaves there,
found when the next run starts; its chief removes it.

TensorFlow 2.21's CheckpointManager saves ckpt-N in three stages (traced with
strace, one host, one shard):
  1. ckpt-N_temp/part-00000-of-00001.data-00000-of-00001 and .index, each
     written as NAME.tempstate<digits> and renamed when whole;
  2. the merge: that data file renamed to ckpt-N.data-00000-of-00001, then
     ckpt-N.index written in place, the part's index deleted, ckpt-N_temp/
     removed;
  3. checkpoints/checkpoint (TF's list) rewritten through
     checkpoint.tmp<32 hex digits> and a rename, naming ckpt-N; the oldest
     beyond max_to_keep deleted; the list rewritten.
A kill in stage 1 leaves ckpt-N_temp/, forever: a later save of N cannot
remove it (the old tempstate file keeps it from being empty). In stage 2 it
leaves ckpt-N.data without a whole index beside ckpt-N_temp/: a ckpt-N that
does not read back, which is no damage but a save that never finished. After
stage 2 it leaves a whole ckpt-N that TF's list does not name: the run
resumes from it, but TF's CheckpointManager deletes only what the list names,
so it stayed beside train.max_checkpoints others for good. In stage 3 it
leaves checkpoint.tmp<hex>.

(A non-chief worker's own scratch folder, killed with it, is the last
part: make_scratch, remove_dead_scratch.)

Only names TF gives these files are touched, a temporary folder only when it
holds nothing else, and never a whole checkpoint: a whole one not listed is
listed instead (TF's manager then deletes it in turn).
"""
import fcntl
import os
import re
import shutil
import tempfile
import time

import tensorflow as tf

from dist_keras import quiet

CHECKPOINTS = "checkpoints/"
LIST_FILE = "checkpoint"  # TensorFlow's list of a folder's checkpoints.

_TEMP_DIR = re.compile(r"ckpt-(\d+)_temp")
# What TF writes in a temporary folder: each shard's data and index file,
# under NAME.tempstate<random digits> until it is whole.
_TEMP_FILE = re.compile(
    r"part-\d+-of-\d+\.(?:index|data-\d+-of-\d+)(?:\.tempstate\d+)?")
_LIST_TMP = re.compile(LIST_FILE + r"\.tmp[0-9a-f]{32}")


def read_list(folder: str):
  """(TF's CheckpointState of `folder` or None, whether its list file is
  there but unreadable), without TF's own warning lines."""
  if not tf.io.gfile.exists(os.path.join(folder, LIST_FILE)):
    return None, False
  with quiet.tf_warnings_off():
    try:
      state = tf.train.get_checkpoint_state(folder)
    except (tf.errors.OpError, ValueError):  # An empty file.
      state = None
  return state, state is None or not state.model_checkpoint_path


def listed(folder: str):
  """TF's list of `folder`'s checkpoints as ([(step, seconds saved at)],
  its last preserved timestamp): ([], 0.0) with no list; None when it is
  unreadable or names anything but ckpt-STEP here (what is unlisted is then
  unknown)."""
  state, unreadable = read_list(folder)
  if unreadable or state is None:
    return None if unreadable else ([], 0.0)
  paths, times = state.all_model_checkpoint_paths, list(
      state.all_model_checkpoint_timestamps)
  if len(times) != len(paths):  # As TF's manager reads a list without them.
    times = [state.last_preserved_timestamp] * len(paths)
  entries = []
  for path, saved in zip(paths, times):
    found = re.fullmatch(r"ckpt-(\d+)", os.path.basename(path))
    if not found or os.path.dirname(path) != folder:
      return None
    entries.append((int(found.group(1)), saved))
  return entries, state.last_preserved_timestamp


def _temp_dir(folder: str, step: int) -> str | None:
  """ckpt-STEP_temp/ in `folder` if it is there holding only what TF writes
  there, else None (a folder holding anything else is not only TF's)."""
  path = os.path.join(folder, f"ckpt-{step}_temp")
  if os.path.islink(path) or not tf.io.gfile.isdir(path):
    return None  # (TF makes a folder: a link there is someone else's.)
  names = [name.rstrip("/") for name in tf.io.gfile.listdir(path)]
  return path if all(_TEMP_FILE.fullmatch(name) for name in names) else None


def cut_short(folder: str, step: int, steps: set[int] | None) -> bool:
  """Whether ckpt-STEP, which does not read back, is a merge cut short:
  its temporary folder is still there and TF's list (its `steps`; None
  when unknown) does not name it, as when the save was killed in stage 2."""
  return (steps is not None and step not in steps
          and _temp_dir(folder, step) is not None)


def _cut_files(folder: str, step: int) -> list[str]:
  """The files TF names ckpt-STEP.* (its index and data shards)."""
  pattern = re.compile(rf"ckpt-{step}\.(?:index|data-\d+-of-\d+)")
  return sorted(name for name in tf.io.gfile.listdir(folder)
                if pattern.fullmatch(name))


def found(folder: str, cut_steps=()) -> list[str]:
  """The names, in `folder`, of what saves cut short left: every
  ckpt-N_temp/ holding only TF's files, every checkpoint.tmp<hex>, and the
  files of the checkpoints `cut_steps` (merges cut short)."""
  if not tf.io.gfile.isdir(folder):
    return []
  names = []
  for name in sorted(tf.io.gfile.listdir(folder)):
    name = name.rstrip("/")  # (gs:// lists folders with a slash.)
    temp = _TEMP_DIR.fullmatch(name)
    if temp and _temp_dir(folder, int(temp.group(1))):
      names.append(name + "/")
    elif _LIST_TMP.fullmatch(name):
      names.append(name)
  for step in cut_steps:
    names += _cut_files(folder, step)
  return names


def remove(folder: str, names) -> list[str]:
  """Removes `names` from `folder`; returns those removed. One that cannot
  be removed is left: it misleads no later run, and failing over it would."""
  removed = []
  for name in names:
    path = os.path.join(folder, name.rstrip("/"))
    try:
      if name.endswith("/"):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
      removed.append(name)
    except (tf.errors.OpError, OSError):
      continue
  return removed


def write_list(folder: str, entries, last_preserved: float = 0.0) -> None:
  """Writes TF's list of `folder`'s checkpoints: `entries` (step, seconds
  saved at), oldest first, names relative to the folder (as TF writes them),
  through a temporary file TF would name (a kill leaves what found() finds)."""
  text = "".join(
      [f'model_checkpoint_path: "ckpt-{entries[-1][0]}"\n'] * bool(entries)
      + [f'all_model_checkpoint_paths: "ckpt-{step}"\n'
         for step, _ in entries]
      + [f"all_model_checkpoint_timestamps: {saved!r}\n"
         for _, saved in entries]
      + [f"last_preserved_timestamp: {last_preserved!r}\n"] * bool(
          last_preserved))
  tmp = os.path.join(folder, f"{LIST_FILE}.tmp{os.urandom(16).hex()}")
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(text)
  tf.io.gfile.rename(tmp, os.path.join(folder, LIST_FILE), overwrite=True)


def list_resumed(folder: str, step: int) -> str | None:
  """Adds ckpt-STEP, the whole checkpoint the run resumes from, to TF's
  list when the list does not name it; returns the clause that says so."""
  known = listed(folder)
  if known is None or step in {s for s, _ in known[0]}:
    return None
  entries, last_preserved = known
  # A time after the list's last preserved one: TF's manager deletes only
  # those, oldest first once max_to_keep is passed.
  write_list(folder, sorted([*entries, (step, time.time())]),
             last_preserved)
  return (f"ckpt-{step} was saved whole but missing from {CHECKPOINTS}"
          f"{LIST_FILE} (TensorFlow's list of the checkpoints; a run killed "
          "as it saved): listed now, so train.max_checkpoints counts it")


def tidy(folder: str, resumed: int | None, cut_steps) -> list[str | None]:
  """What saves cut short left, removed (the files of the checkpoints
  `cut_steps` too); the checkpoint resumed from (its step, None: none)
  added to TF's list if a kill kept it out; the clauses that say so."""
  listed = None if resumed is None else list_resumed(folder, resumed)
  return [listed, removed_line(remove(folder, found(folder, cut_steps)))]


def removed_line(removed) -> str | None:
  if not removed:
    return None
  return (f"removed what saves cut short left in {CHECKPOINTS}: "
          f"{', '.join(removed)}")


# A non-chief worker's checkpoints go to a scratch folder of its own, which
# it deletes as it ends; a SIGKILL left it, with a whole checkpoint, in the
# temporary directory for good (90 of them on one test host). Each holds a
# lock its worker keeps while it runs (the kernel drops it when the process
# ends, however it ends): a new worker removes those whose lock it can take.
_SCRATCH_PREFIX = "dist_keras_worker_"
_SCRATCH_LOCK = ".lock"


def make_scratch() -> tuple[str, int]:
  """(a new scratch folder, the descriptor holding its lock), after
  removing the folders of workers that ended without deleting theirs."""
  remove_dead_scratch()
  folder = tempfile.mkdtemp(prefix=_SCRATCH_PREFIX)
  # Locked before it takes the name another worker looks for.
  taking = os.path.join(folder, _SCRATCH_LOCK + ".taking")
  lock = os.open(taking, os.O_CREAT | os.O_RDWR, 0o600)
  fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  os.rename(taking, os.path.join(folder, _SCRATCH_LOCK))
  return folder, lock


def remove_dead_scratch(parent: str | None = None) -> list[str]:
  """Removes the scratch folders in `parent` (the temporary directory)
  whose lock no process holds; returns them. One without a lock (made
  before locks, or not dist_keras') is left."""
  parent = parent or tempfile.gettempdir()
  removed = []
  for name in sorted(os.listdir(parent)):
    path = os.path.join(parent, name)
    if not name.startswith(_SCRATCH_PREFIX) or os.path.islink(path):
      continue
    try:
      lock = os.open(os.path.join(path, _SCRATCH_LOCK), os.O_RDWR)
    except OSError:
      continue
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      shutil.rmtree(path, ignore_errors=True)  # (Its lock held meanwhile.)
      removed.append(path)
    except OSError:  # Held: its worker runs.
      pass
    finally:
      os.close(lock)
  return removed
