"""The disk under a running job (disk.py): full, read-only or no longer
permitted, at start, at a checkpoint, at SIGTERM's checkpoint. Each is one
line naming the file, the fix and the last checkpoint kept (or none), the
same from dist_keras.fit and the command line; nothing new is left behind,
and the call once fixed resumes. Real faults on a small tmpfs or a
read-only bind mount (skipped where mounting is not permitted), else a
chmod for a user without root's override."""
import contextlib
import errno
import os
import shutil
import signal
import subprocess

import keras
import pytest
import tensorflow as tf

import dist_keras
import helpers
import user_task
from dist_keras import disk, errors
from dist_keras.training import run_files

CONFIG = {"train.global_batch_size": user_task.GLOBAL_BATCH,
          "train.steps": 8, "train.log_every": 4,
          "train.checkpoint_every": 4, "eval.every": 0,
          "log.calibration_steps": 0, "log.progress": False,
          "log.tensorboard": False, "log.sync_timing": False}
# TensorFlow 2.21's texts for a checkpoint's write on a full disk and on a
# read-only one (as the runs below raise them).
_SAVE_FULL = ("{{function_node __wrapped__SaveV2_dtypes_26_device_/job:"
              "localhost/replica:0/task:0/device:CPU:0}} W/checkpoints/"
              "ckpt-40_temp/part-00000-of-00001.data-00000-of-00001."
              "tempstate16431072245324830816; No space left on device "
              "[Op:SaveV2]")
_SAVE_READ_ONLY = ("{{function_node __wrapped__SaveV2_dtypes_26_device_/job:"
                   "localhost/replica:0/task:0/device:CPU:0}} W/checkpoints/"
                   "ckpt-30_temp; Read-only file system [Op:SaveV2]")


def _run(*args):
  result = subprocess.run(args, capture_output=True, text=True, check=False)
  return result.returncode == 0, result.stderr.strip()


@contextlib.contextmanager
def _mounted(path, *how):
  """`mount *how path` (a tmpfs, a bind), unmounted after; the test is
  skipped where this process may not mount."""
  path.mkdir(parents=True, exist_ok=True)
  done, why = _run("mount", *how, str(path))
  if not done:
    pytest.skip(f"cannot mount here ({why or 'not permitted'})")
  try:
    yield path
  finally:
    if not _run("umount", str(path))[0]:
      _run("umount", "-l", str(path))


def _read_only(path):
  """`path` as a read-only bind mount of itself (EROFS for every write)."""
  stack = contextlib.ExitStack()
  stack.enter_context(_mounted(path, "--bind", str(path)))
  if not _run("mount", "-o", "remount,bind,ro", str(path))[0]:
    stack.close()
    pytest.skip("cannot remount read-only here")
  return stack


def _fill(folder) -> None:
  """Fills the file system of `folder` to its last byte."""
  with contextlib.suppress(OSError), open(os.path.join(folder, "filler"),
                                         "wb") as f:
    while True:
      f.write(b"\0" * 65536)
      f.flush()


def _fake_run(workdir, steps=(20,)):
  """A workdir as a run leaves it (its checkpoints' names: kept() reads
  no more)."""
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / "config.json").write_text("{}")
  for step in steps:
    (workdir / "checkpoints" / f"ckpt-{step}.index").write_text("x")


class _When(keras.callbacks.Callback):
  """Calls `act` once, at the first batch end after `path` appears."""

  def __init__(self, path, act):
    super().__init__()
    self.path, self.act, self.done = str(path), act, False

  def on_train_batch_end(self, batch, logs=None):
    if not self.done and os.path.exists(self.path):
      self.done = True
      self.act()


def _fit(workdir, callbacks=(), **config):
  return dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                        workdir=str(workdir), config={**CONFIG, **config},
                        strategy="one_device", callbacks=list(callbacks))


def test_the_line_says_the_cause_whole_and_the_file_short():
  """It kept TensorFlow's {{function_node ...}} prefix and cut at 160
  characters: the file's name chopped, 'No space left o)'."""
  line = str(disk.fault(tf.errors.ResourceExhaustedError(None, None,
                                                         _SAVE_FULL), "W"))
  assert line == (
      "no space left on device writing checkpoints/ckpt-40_temp/part-00000-"
      "of-00001.data-00000-of-00001 in W (ResourceExhaustedError in SaveV2);"
      " free space where the workdir is and rerun the same command: no "
      "checkpoint is kept there, so it starts from step 0.")
  line = str(disk.fault(OSError(errno.ENOSPC, "No space left on device",
                                "/tmp/dist_keras_worker_1/x.data"), "W"))
  assert "writing /tmp/dist_keras_worker_1/x.data (OSError); free space " \
         "where /tmp/dist_keras_worker_1 is" in line  # Not the workdir's.
  line = str(disk.fault(tf.errors.PermissionDeniedError(
      None, None, _SAVE_READ_ONLY), "W"))
  assert line.startswith(
      "cannot write in W/checkpoints (Read-only file system: checkpoints/"
      "ckpt-30_temp, PermissionDeniedError in SaveV2); make it writable")
  # A user's data file it may not read is not the workdir's disk.
  assert disk.fault(tf.errors.PermissionDeniedError(
      None, None, "/data/train.tfrecord; Permission denied"), "W") is None
  assert disk.fault(ValueError("No space left in the batch"), "W") is None


def test_the_checkpoint_kept_is_the_newest_saved_whole(tmp_path):
  """The line said 'it resumes from the last checkpoint kept there' when
  there was none (SIGTERM's save failing before the first)."""
  assert disk.kept(str(tmp_path)) is None
  _fake_run(tmp_path, steps=(10, 20, 30))
  (tmp_path / "checkpoints" / "ckpt-30_temp").mkdir()  # Its merge failed.
  assert disk.kept(str(tmp_path)) == "ckpt-20"
  assert disk.resumes(str(tmp_path)) == (
      "it resumes from ckpt-20, the last checkpoint kept there")
  assert disk.kept("gs://bucket/run") is ...


def test_a_full_disk_at_start_says_so_and_leaves_nothing(tmp_path):
  """It was 'is not writable (ResourceExhaustedError); pass a folder you
  can write to', exit 2 (abandon a resumable run), leaving .write_test and
  a new folder."""
  with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=256k",
                "tmpfs") as mount:
    _fake_run(mount / "w")
    _fill(mount)
    before = sorted(os.walk(mount))
    with pytest.raises(errors.NoSpace, match=(
        r"^no space left on device writing \.write_test in .*/w \(\w+\); "
        r"free space where the workdir is and rerun the same command: it "
        r"resumes from ckpt-20, the last checkpoint kept there\.$")):
      run_files.prepare(str(mount / "w"))
    with pytest.raises(errors.NoSpace, match="no checkpoint is kept there"):
      run_files.prepare(str(mount / "new" / "run"))
    assert sorted(os.walk(mount)) == before
    result = helpers.run_module(["-m", "dist_keras.train",
                                 f"--workdir={mount / 'w'}"], timeout=120)
    assert result.returncode == errors.EXIT_UNEXPECTED == 1
    assert result.stderr.splitlines()[-1].startswith(
        "dist_keras: error: no space left on device writing .write_test"), (
            result.stderr)
    assert sorted(os.walk(mount)) == before


def test_a_full_disk_at_a_checkpoint_raises_nospace_from_fit(tmp_path):
  """fit raised TensorFlow's ResourceExhaustedError (the command line's
  NoSpace line was train.main's alone)."""
  with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=2m",
                "tmpfs") as mount:
    workdir = mount / "w"
    filling = _When(workdir / "checkpoints" / "ckpt-4.index",
                    lambda: _fill(mount))
    with pytest.raises(errors.NoSpace) as caught:
      _fit(workdir, [filling])
    assert str(caught.value).startswith(
        "no space left on device writing checkpoints/ckpt-8_temp/"), (
            caught.value)
    assert str(caught.value).endswith(
        "it resumes from ckpt-4, the last checkpoint kept there.")
    os.remove(mount / "filler")
    assert _fit(workdir).summary["resumed"]["resumed_at"] == [4]


def test_sigterm_on_a_full_disk_says_no_checkpoint_is_kept(tmp_path):
  """SIGTERM's checkpoint failed on a full disk before any other was
  saved: the line said 'it resumes from the last checkpoint kept there'."""
  def fill_and_stop():
    _fill(mount)
    signal.raise_signal(signal.SIGTERM)
  with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=2m",
                "tmpfs") as mount:
    with pytest.raises(errors.NoSpace, match=(
        r"free space where the workdir is and rerun the same command: no "
        r"checkpoint is kept there, so it starts from step 0\.$")):
      _fit(mount / "w", [_When(mount / "w" / "config.json", fill_and_stop)],
           **{"train.checkpoint_every": 100})


def test_write_access_lost_mid_run_says_so_and_a_rerun_is_refused_first(
    tmp_path):
  """It was 'PermissionDeniedError: ...; Read-only file system [Op:SaveV2]
  (unexpected; ...)' (fit: that error raw), and the rerun, still read-only,
  'pass a folder you can write to' (exit 2), after TensorFlow's start-up."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  read_only = []
  lose = _When(workdir / "checkpoints" / "ckpt-4.index",
               lambda: read_only.append(_read_only(workdir)))
  try:
    with pytest.raises(errors.NoWriteAccess, match=(
        rf"^cannot write in {workdir}/checkpoints \(Read-only file system: "
        r"checkpoints/ckpt-8_temp, PermissionDeniedError in SaveV2\); make "
        "it writable, then rerun the same command with the same workdir: it "
        r"resumes from ckpt-4, the last checkpoint kept there\.$")):
      _fit(workdir, [lose])
    with pytest.raises(errors.NoWriteAccess, match=(
        rf"^cannot write in {workdir} \(Read-only file system\); ")):
      _fit(workdir)
    result = helpers.run_module(["-m", "dist_keras.train",
                                 f"--workdir={workdir}"], timeout=120)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert result.stderr == (
        f"dist_keras: error: cannot write in {workdir} (Read-only file "
        "system); make it writable, then rerun the same command with the "
        "same workdir: it resumes from ckpt-4, the last checkpoint kept "
        "there.\n")
  finally:
    for mount in read_only:
      mount.close()
  assert _fit(workdir).summary["resumed"]["resumed_at"] == [4]


def test_a_rerun_without_permission_on_checkpoints_is_refused(tmp_path):
  """It passed the workdir check and failed after TensorFlow's start, as
  'unexpected'. (Root's override skips it: tools like setpriv drop it.)"""
  _fake_run(tmp_path)
  (tmp_path / "checkpoints").chmod(0o555)
  try:
    if os.access(tmp_path / "checkpoints", os.W_OK):
      pytest.skip("this process may write anywhere (root's override)")
    with pytest.raises(errors.NoWriteAccess, match=(
        rf"^cannot write in {tmp_path}/checkpoints \(Permission denied\); "
        "make it writable, then rerun the same command with the same "
        "workdir: it resumes from ckpt-20")):
      disk.check_rerun(str(tmp_path))
  finally:
    (tmp_path / "checkpoints").chmod(0o755)


def test_a_failed_model_save_names_its_file(tmp_path, monkeypatch):
  """Keras' save raised a bare OSError: the line named no file."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])

  def full(self, filepath, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(keras.Model, "save", full)
  with pytest.raises(OSError) as caught:
    run_files.save_model(str(tmp_path), model)
  assert str(disk.fault(caught.value, str(tmp_path))).startswith(
      f"no space left on device writing model.tmp.keras in {tmp_path} "
      "(OSError); ")


def test_a_workdir_removed_mid_run_stops_it_after_the_checkpoint(tmp_path):
  """It was made anew by the next save and the run ended 'done', exit 0,
  without config.json, its lock or any TensorBoard event, unsaid."""
  workdir = tmp_path / "w"

  def remove():
    os.rename(workdir, tmp_path / "gone")
    shutil.rmtree(tmp_path / "gone")
  with pytest.raises(errors.WorkdirRemoved, match=(
      rf"^workdir='{workdir}' was removed or moved away while the run went "
      r"\(with its \.lock, config\.json and TensorBoard's events\): stopped "
      r"after saving ckpt-8 in it anew; rerun the same command to resume ")):
    _fit(workdir, [_When(workdir / "checkpoints" / "ckpt-4.index", remove)],
         **{"train.steps": 12})
  assert not (workdir / "summary.json").exists()
  result = _fit(workdir, **{"train.steps": 12})
  assert result.summary["resumed"]["resumed_at"] == [8]
  assert (workdir / "config.json").exists()
