"""A damaged latest checkpoint (a node lost mid-copy, a full disk, a bad sync
from a bucket) is named and passed over: the run resumes from the one
before and ends bitwise equal to an uninterrupted run. None intact: one
line and a retryable exit code. A different model's checkpoint is still
refused with exit 2 (tests/training/test_loop.py)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import user_task
from dist_keras import errors
from dist_keras.training import checkpoints

EVERY, STEPS = helpers.CHECKPOINT_EVERY, helpers.CHECKPOINT_STEPS
CONFIG = helpers.CHECKPOINT_RUN
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")
DATA = "ckpt-12.data-00000-of-00001"


def _fit(workdir):
  return dist_keras.fit(user_task.model_fn_dropout, user_task.dataset_fn,
                        workdir=str(workdir), config=CONFIG, strategy=ONE_CPU)


def _tensors(path):
  """Every tensor but the object graph and the record (run_record.py: it
  holds the run's timings)."""
  reader = tf.train.load_checkpoint(path)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
          and not n.startswith("record/")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """An uninterrupted run's workdir: ckpt-4, ckpt-8 and ckpt-12."""
  workdir = tmp_path_factory.mktemp("whole")
  _fit(workdir)
  return workdir


def _damage(path, how):
  with open(path, "rb") as f:
    data = f.read()
  if how == "missing":
    os.remove(path)
    return
  with open(path, "wb") as f:  # Cut in half, or as many random bytes.
    f.write(data[:len(data) // 2] if how == "truncated"
            else np.random.default_rng(0).bytes(len(data)))


@pytest.mark.parametrize("name,how,why", [
    ("ckpt-12.index", "truncated", "not an sstable"),
    ("ckpt-12.index", "overwritten", "not an sstable"),
    (DATA, "truncated", "Read less bytes than requested"),
    (DATA, "overwritten", "Checksum does not match"),
    (DATA, "missing", "No such file or directory"),
])
def test_a_damaged_latest_checkpoint_is_passed_over(
    whole, tmp_path, capsys, name, how, why):
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  _damage(workdir / "checkpoints" / name, how)
  capsys.readouterr()
  result = _fit(workdir)
  out = capsys.readouterr().out
  [line] = [x for x in out.splitlines() if "is damaged" in x]
  assert line.startswith("ckpt-12 is damaged (") and why in line, out
  assert line.endswith("): resuming from ckpt-8 at step 8"), line
  assert result.summary["steps"] == STEPS
  expected = _tensors(os.path.join(whole, "checkpoints", "ckpt-12"))
  got = _tensors(os.path.join(workdir, "checkpoints", "ckpt-12"))
  assert got.keys() == expected.keys()
  for key, value in expected.items():  # Bitwise: the resume is exact.
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_lost_state_file_hides_no_checkpoint(whole, tmp_path):
  """checkpoints/checkpoint (TF's list of them) overwritten: TF's own
  latest_checkpoint then says 'none' and a run would start over, writing
  over step 4's checkpoint with a new run's."""
  folder = tmp_path / "run" / "checkpoints"
  shutil.copytree(whole, tmp_path / "run")
  (folder / "checkpoint").write_text("garbage {{")
  assert tf.train.latest_checkpoint(str(folder)) is None
  resume = checkpoints.find_resume(str(tmp_path / "run"))
  assert (resume.step, resume.damaged) == (12, ())


@pytest.mark.parametrize("text", ["", "garbage {{"])
def test_an_unreadable_state_file_is_rewritten_quietly(whole, tmp_path,
                                                       capfd, text):
  """An empty list made TensorFlow's CheckpointManager raise (exit 1); a
  garbled one printed its warnings and left the old checkpoints to pile
  up. The run resumes, says so, and keeps train.max_checkpoints."""
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  (workdir / "checkpoints" / "checkpoint").write_text(text)
  capfd.readouterr()
  result = dist_keras.fit(
      user_task.model_fn_dropout, user_task.dataset_fn,
      workdir=str(workdir), strategy=ONE_CPU,
      config={**CONFIG, "train.steps": STEPS + EVERY, "log.progress": True})
  out, err = capfd.readouterr()
  assert ("checkpoints/checkpoint (TensorFlow's list of the checkpoints) was "
          "unreadable: rewritten from the checkpoint files; resumed from "
          "ckpt-12 at step 12") in out, out
  assert "checkpoint" not in err, err
  assert result.summary["steps"] == STEPS + EVERY
  state = tf.train.get_checkpoint_state(str(workdir / "checkpoints"))
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
      "ckpt-8", "ckpt-12", "ckpt-16"]
  assert not (workdir / "checkpoints" / "ckpt-4.index").exists()


def test_no_intact_checkpoint_is_one_line_and_a_retryable_exit(
    whole, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  for step in (4, 8, 12):
    _damage(workdir / "checkpoints" / f"ckpt-{step}.index", "truncated")
  before = sorted(os.listdir(workdir))
  with pytest.raises(errors.NoIntactCheckpoint, match="no checkpoint reads"):
    _fit(workdir)
  out = subprocess.run(
      [sys.executable, "-m", "dist_keras.train", f"--workdir={workdir}",
       "--config.model.name=user_task:model_fn_dropout",
       "--config.data.name=user_task:dataset_fn"],
      capture_output=True, text=True, check=False, cwd=helpers.TESTS,
      env=dict(os.environ, PYTHONPATH=f"{helpers.REPO}:{helpers.TESTS}"),
      timeout=300)
  assert out.returncode == errors.EXIT_NO_INTACT_CHECKPOINT, out.stderr
  assert errors.EXIT_NO_INTACT_CHECKPOINT in errors.RETRYABLE
  [line] = out.stderr.strip().splitlines()
  assert line.startswith(f"dist_keras: error: --workdir={workdir}: no "
                         "checkpoint reads back: ckpt-12 is damaged ("), line
  assert "ckpt-4 is damaged" in line and "backup" in line
  assert sorted(os.listdir(workdir)) == before  # Nothing written.
