"""What a checkpoint save killed mid-way leaves in checkpoints/ is removed
by the next run's chief, and a whole checkpoint TensorFlow's list missed is
listed (dist_keras/training/checkpoint_files.py).

The leftovers are made as TF 2.21 leaves them (traced with strace, and
reproduced with SIGKILLs of `python -m dist_keras.train`): ckpt-N_temp/
with a part file (stage 1 of a save), ckpt-N.data beside ckpt-N_temp/'s
index (stage 2, the merge), checkpoint.tmp<32 hex> (stage 3, the list), a
whole ckpt-N the list does not name (between stages 2 and 3)."""
import fcntl
import os
import shutil
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

import dist_keras
import helpers
import user_task
from dist_keras.distribute import strategies
from dist_keras.training import checkpoint_files, checkpoints

EVERY, STEPS = helpers.CHECKPOINT_EVERY, helpers.CHECKPOINT_STEPS
CONFIG = helpers.CHECKPOINT_RUN
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")
PART = "part-00000-of-00001"
DATA = "data-00000-of-00001"
LIST_TMP = "checkpoint.tmp" + "0123456789abcdef" * 2


def _fit(workdir, steps):
  return dist_keras.fit(user_task.model_fn_dropout, user_task.dataset_fn,
                        workdir=str(workdir), strategy=ONE_CPU,
                        config={**CONFIG, "train.steps": steps,
                                "log.progress": True})


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """An uninterrupted run's workdir: ckpt-4, ckpt-8 and ckpt-12, listed."""
  workdir = tmp_path_factory.mktemp("whole")
  _fit(workdir, STEPS)
  return workdir


@pytest.fixture
def run(whole, tmp_path):
  """A copy of `whole` to rerun; its checkpoints folder."""
  shutil.copytree(whole, tmp_path / "run")
  return tmp_path / "run" / "checkpoints"


def _cut_merge(folder, step, source=None):
  """ckpt-STEP as a kill in its merge leaves it: the data file moved out of
  ckpt-STEP_temp/, whose index is still there; no ckpt-STEP.index (the
  files: the newest checkpoint in `source`, by default `folder`)."""
  source = source or folder
  newest = tf.train.latest_checkpoint(str(source))
  (folder / f"ckpt-{step}_temp").mkdir()
  shutil.copy(newest + ".index",
              folder / f"ckpt-{step}_temp" / f"{PART}.index")
  shutil.copy(f"{newest}.{DATA}", folder / f"ckpt-{step}.{DATA}")


def _unlist(folder, step):
  """TF's list as it was before ckpt-STEP was listed (saved, then killed)."""
  state = tf.train.get_checkpoint_state(str(folder))
  entries = [(int(os.path.basename(p)[5:]), t) for p, t in zip(
      state.all_model_checkpoint_paths, state.all_model_checkpoint_timestamps)
             if p != str(folder / f"ckpt-{step}")]
  checkpoint_files.write_list(str(folder), entries,
                              state.last_preserved_timestamp)


def _names(folder):
  return sorted(os.listdir(folder))


def _kept(*steps):
  return sorted(["checkpoint"] + [f"ckpt-{s}.{e}" for s in steps
                                  for e in ("index", DATA)])


def test_a_killed_saves_leftovers_are_removed_on_the_rerun(run, capsys):
  """They stayed for good: a rerun's save of ckpt-16 could not remove
  ckpt-16_temp/ (the old tempstate file kept it from being empty)."""
  (run / "ckpt-16_temp").mkdir()
  (run / "ckpt-16_temp" / f"{PART}.{DATA}.tempstate12345").write_bytes(b"x")
  (run / LIST_TMP).write_text('model_checkpoint_path: "ck')
  capsys.readouterr()
  _fit(run.parent, 16)
  out = capsys.readouterr().out
  assert _names(run) == _kept(8, 12, 16)
  assert ("\nremoved what saves cut short left in checkpoints/: "
          f"{LIST_TMP}, ckpt-16_temp/; resumed from ckpt-12 at step 12\n"
          in out), out


def test_a_merge_cut_short_is_removed_not_called_damage(run, capsys):
  _cut_merge(run, 16)
  capsys.readouterr()
  _fit(run.parent, 16)
  out = capsys.readouterr().out
  assert _names(run) == _kept(8, 12, 16)
  assert "is damaged" not in out, out
  assert ("\nremoved what saves cut short left in checkpoints/: "
          f"ckpt-16_temp/, ckpt-16.{DATA}; resumed from ckpt-12 at step 12\n"
          in out), out


def test_a_whole_checkpoint_missing_from_the_list_is_listed(run, capsys):
  """It was resumed from but never deleted: train.max_checkpoints=3 kept
  four checkpoints for good (ckpt-8, 12, 16 and 20)."""
  _unlist(run, 12)
  capsys.readouterr()
  _fit(run.parent, 20)
  out = capsys.readouterr().out
  assert _names(run) == _kept(12, 16, 20)
  assert ("\nckpt-12 was saved whole but missing from checkpoints/checkpoint "
          "(TensorFlow's list of the checkpoints; a run killed as it saved): "
          "listed now, so train.max_checkpoints counts it; resumed from "
          "ckpt-12 at step 12\n" in out), out


def test_a_first_save_cut_short_is_a_fresh_start_not_exit_201(tmp_path):
  """Killed in the merge of its first save, a workdir held only a ckpt-4
  that does not read back: every rerun exited 201, 'no checkpoint reads
  back'."""
  made, folder = tmp_path / "made", tmp_path / "run" / "checkpoints"
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(v=tf.Variable(1.0)), str(made), max_to_keep=3)
  manager.save(checkpoint_number=4)
  folder.mkdir(parents=True)
  _cut_merge(folder, 4, source=made)
  assert checkpoints.find_resume(str(folder.parent)) == checkpoints.Resume(
      None, 0, cut_short=(4,))
  shutil.copy(made / "ckpt-4.index", folder)  # The merge done, ...
  shutil.copy(made / "checkpoint", folder)  # ... and listed.
  _cut_merge(folder, 8, source=made)
  assert checkpoints.find_resume(str(folder.parent)) == checkpoints.Resume(
      str(folder / "ckpt-4"), 4, cut_short=(8,))


def test_only_what_tf_leaves_is_found(tmp_path):
  folder = tmp_path / "checkpoints"
  for name in ("ckpt-4_temp", "ckpt-8_temp", "ckpt-12_temp", "mine_temp",
               "ckpt-16_temp_old", "elsewhere"):
    (folder / name).mkdir(parents=True)
  (folder / "ckpt-4_temp" / f"{PART}.index.tempstate99").write_text("")
  (folder / "ckpt-12_temp" / f"{PART}.index").write_text("")
  (folder / "ckpt-12_temp" / "notes.txt").write_text("a user's file")
  os.symlink(folder / "elsewhere", folder / "ckpt-20_temp")
  for name in (LIST_TMP, "checkpoint.tmp", LIST_TMP + "x", "ckpt-24.index",
               f"ckpt-24.{DATA}", "ckpt-28.index", "ckpt-28.keep"):
    (folder / name).write_text("")
  assert checkpoint_files.found(str(folder), cut_steps=(28,)) == [
      LIST_TMP, "ckpt-4_temp/", "ckpt-8_temp/", "ckpt-28.index"]
  assert not checkpoint_files.cut_short(str(folder), 12, set())
  assert not checkpoint_files.cut_short(str(folder), 4, {4})  # Listed.
  assert not checkpoint_files.cut_short(str(folder), 4, None)  # Unknown.
  assert checkpoint_files.cut_short(str(folder), 4, {8})


@pytest.mark.parametrize("chief", [True, False])
def test_only_the_chief_removes(tmp_path, chief):
  """Every worker reads the chief's folder; only the chief writes it."""
  folder = tmp_path / "checkpoints"
  (folder / "ckpt-4_temp").mkdir(parents=True)
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  role = strategies.Role(ONE_CPU, chief=chief, workers=1)
  saved, line = checkpoints.restored(str(tmp_path), model, {}, role, 3,
                                     checkpoints.Resume(None, 0))
  saved.close()
  assert (folder / "ckpt-4_temp").exists() != chief
  assert line == ("removed what saves cut short left in checkpoints/: "
                  "ckpt-4_temp/" if chief else None)


def test_a_killed_workers_scratch_folder_is_removed_by_the_next_worker(
    tmp_path):
  """A non-chief worker SIGKILLed left its scratch folder (a whole
  checkpoint) in the temporary directory for good; one whose worker runs,
  one without a lock and a link are left."""
  killed = subprocess.run(
      [sys.executable, "-c",
       "import os, signal; from dist_keras.training import checkpoint_files"
       " as f; print(f.make_scratch()[0], flush=True); "
       "os.kill(os.getpid(), signal.SIGKILL)"],
      env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True,
      text=True, timeout=120, check=False)
  dead = killed.stdout.strip()
  assert killed.returncode == -9 and os.path.isdir(dead), killed.stderr
  live, live_lock = checkpoint_files.make_scratch()  # (In /tmp.)
  alive = tmp_path / "dist_keras_worker_alive"
  shutil.copytree(live, alive)
  held = os.open(alive / ".lock", os.O_RDWR)
  fcntl.flock(held, fcntl.LOCK_EX)
  (tmp_path / "dist_keras_worker_unlocked").mkdir()
  (tmp_path / "dist_keras_worker_link").symlink_to(dead)
  try:
    assert checkpoint_files.remove_dead_scratch(str(tmp_path)) == [dead]
    assert sorted(os.listdir(tmp_path)) == [
        "dist_keras_worker_alive", "dist_keras_worker_link",
        "dist_keras_worker_unlocked"]
    assert live not in checkpoint_files.remove_dead_scratch()
  finally:
    os.close(held)
    os.close(live_lock)
    shutil.rmtree(live)
