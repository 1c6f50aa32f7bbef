"""The disk under a run's workdir failing its writes: full (NoSpace), or no
longer writable (NoWriteAccess: a read-only remount, changed permissions).
Either keeps every checkpoint saved whole, so each line names the last one
kept (or none) and how to go on from it: the command line's and
dist_keras.fit's alike (api.run translates, as it does a lost peer).

No TensorFlow import: its errors are told apart by their text (the command
line checks a rerun's workdir here before TensorFlow starts).
"""
import errno
import os
import re

from dist_keras import errors

CHECKPOINTS = "checkpoints"  # The workdir's folder of checkpoints.
CONFIG_JSON = "config.json"  # What a run writes first (run_files).
_FULL, _READ_ONLY, _DENIED = ("No space left on device",
                              "Read-only file system", "Permission denied")
_ERRNO = {errno.ENOSPC: _FULL, errno.EROFS: _READ_ONLY,
          errno.EACCES: _DENIED, errno.EPERM: _DENIED}
# TensorFlow's text for a file it could not write: "{{function_node
# __wrapped__SaveV2_device_/job:...}} PATH; No space left on device
# [Op:SaveV2]" (the prefix only when an op raised it).
_TF_TEXT = re.compile(r"^(?:\{\{function_node [^}]*\}\}\s*)?(.*?); "
                      rf"({_FULL}|{_READ_ONLY}|{_DENIED})(?: \[Op:(\w+)\])?")
# What TensorFlow writes under a temporary name and renames when whole.
_TEMP_NAME = re.compile(r"(\.tempstate\d+|\.tmp[0-9a-f]{32})$")
_WHOLE = re.compile(r"ckpt-(\d+)\.index")
_LONGEST_PATH = 120


def fault(error: BaseException, workdir: str):
  """The NoSpace or NoWriteAccess for an error a write raised (TensorFlow's
  or Python's), else None. A permission error counts only on a file in the
  workdir: a user's data file that cannot be read is not the disk's."""
  found = None if isinstance(error, errors.KNOWN) else _failed_write(error)
  if found is None:
    return None
  path, why, op = found
  inside = path is not None and _inside(path, workdir)
  if why == _DENIED and not inside:
    return None
  said = f"{type(error).__name__}" + (f" in {op}" if op else "")
  shown = _shown(path, workdir) if path else None
  if why == _FULL:
    where, room = ((f"{shown} in {workdir}" if shown else f"in {workdir}",
                    "the workdir") if inside or path is None
                   else (shown, os.path.dirname(path)))
    return errors.NoSpace(
        f"no space left on device writing {where} ({said}); free space "
        f"where {room} is and rerun the same command: {resumes(workdir)}.")
  folder = _folder_of(path, workdir) if path else workdir
  return errors.NoWriteAccess(_no_access(
      folder, f"{why}: {shown}, {said}" if shown else f"{why}, {said}",
      workdir))


def check_rerun(workdir: str) -> None:
  """Raises NoWriteAccess if `workdir` holds a run (checkpoints/ or
  config.json: a rerun) that cannot be written there, it or checkpoints/
  (a read-only file system, or its permissions): refused before any work,
  not at the first save. A folder holding no run is validate.workdir's."""
  if "://" in workdir or not os.path.isdir(workdir):
    return
  folder = os.path.join(workdir, CHECKPOINTS)
  if not (os.path.isdir(folder)
          or os.path.exists(os.path.join(workdir, CONFIG_JSON))):
    return
  for path in (workdir, folder):
    if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
      why = (_READ_ONLY if os.statvfs(path).f_flag & os.ST_RDONLY
             else _DENIED)
      raise errors.NoWriteAccess(_no_access(path, why, workdir))


def _no_access(folder: str, said: str, workdir: str) -> str:
  return (f"cannot write in {folder} ({said}); make it writable, then rerun "
          f"the same command with the same workdir: {resumes(workdir)}.")


def resumes(workdir: str) -> str:
  """What a rerun in `workdir` resumes from, as a clause: the newest
  checkpoint saved whole there (kept), or none."""
  name = kept(workdir)
  if name is ...:
    return "it resumes from the last checkpoint kept there, if any"
  if name is None:
    return "no checkpoint is kept there, so it starts from step 0"
  return f"it resumes from {name}, the last checkpoint kept there"


def kept(workdir: str):
  """The name of the newest checkpoint saved whole in a local `workdir`
  ("ckpt-30"), None if there is none, ... if unknown (gs://, unreadable).
  Read from the names alone (a failure's line must not read gigabytes): a
  save that failed before its merge left its ckpt-N_temp/ folder beside
  it; one that failed writing TensorFlow's list after it is whole."""
  if "://" in workdir:
    return ...
  try:
    names = set(os.listdir(os.path.join(workdir, CHECKPOINTS)))
  except FileNotFoundError:
    return None
  except OSError:
    return ...
  steps = [int(m.group(1)) for m in map(_WHOLE.fullmatch, names)
           if m and f"ckpt-{m.group(1)}_temp" not in names]
  return f"ckpt-{max(steps)}" if steps else None


def _failed_write(error: BaseException):
  """(path or None, why, op or None) of a write that failed, else None."""
  why = _ERRNO.get(getattr(error, "errno", None))
  if why:  # Python's OSError (Keras' model.save; an open).
    return getattr(error, "filename", None), why, None
  for line in str(error).splitlines():
    found = _TF_TEXT.match(line.strip())
    if found and (found.group(2) != _DENIED
                  or type(error).__name__ == "PermissionDeniedError"):
      return found.group(1), found.group(2), found.group(3)
  return None


def _inside(path: str, workdir: str) -> bool:
  if "://" in workdir:
    return path.startswith(workdir.rstrip("/") + "/")
  return os.path.abspath(path).startswith(
      os.path.join(os.path.abspath(workdir), ""))


def _shown(path: str, workdir: str) -> str:
  """`path` for the line: relative to the workdir when in it, without
  TensorFlow's temporary suffix, its middle left out when long."""
  shown = _TEMP_NAME.sub("", path)
  if _inside(path, workdir) and "://" not in workdir:
    shown = os.path.relpath(_TEMP_NAME.sub("", os.path.abspath(path)),
                            os.path.abspath(workdir))
  if len(shown) <= _LONGEST_PATH:
    return shown
  return shown[:40] + "..." + shown[-(_LONGEST_PATH - 43):]


def _folder_of(path: str, workdir: str) -> str:
  """The run's folder `path` is in (checkpoints/ or the workdir), else its
  own folder: what the user makes writable again."""
  folder = os.path.join(workdir, CHECKPOINTS)
  for candidate in (folder, workdir):
    if _inside(path, candidate):
      return candidate
  return os.path.dirname(path)
