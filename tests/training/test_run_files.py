"""The run's own files appear whole or not at all: a run that dies in the
middle of rewriting summary.json or model.keras leaves the old file (the
new one goes to a temporary name, then is renamed over it)."""
import json
import os
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

from dist_keras.errors import UserError
from dist_keras.training import run_config, run_files


class _Died(Exception):
  pass


class _DiesMidWrite(tf.io.gfile.GFile):
  """A file whose write puts down half of its text, then the process
  'dies' (as a kill or a full disk would cut it)."""

  def write(self, text):
    super().write(text[:len(text) // 2])
    self.flush()
    raise _Died()


def test_a_death_mid_write_leaves_the_old_summary(tmp_path, monkeypatch):
  run_files.write_json(str(tmp_path), run_files.SUMMARY_JSON, {"steps": 10})
  monkeypatch.setattr(tf.io.gfile, "GFile", _DiesMidWrite)
  with pytest.raises(_Died):
    run_files.write_json(str(tmp_path), run_files.SUMMARY_JSON,
                         {"steps": 20, "values": list(range(1000))})
  with open(tmp_path / run_files.SUMMARY_JSON, encoding="utf-8") as f:
    assert json.load(f) == {"steps": 10}
  assert sorted(os.listdir(tmp_path)) == [run_files.SUMMARY_JSON]


def test_a_value_that_cannot_be_written_leaves_the_old_file(tmp_path):
  run_files.write_json(str(tmp_path), "x.json", {"a": 1})
  with pytest.raises(TypeError):
    run_files.write_json(str(tmp_path), "x.json", {"a": object()})
  assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}
  assert sorted(os.listdir(tmp_path)) == ["x.json"]  # No half-written tmp.


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
  (tmp_path / "x.json").mkdir()  # Not a file: the rename fails.
  with pytest.raises((tf.errors.OpError, OSError)):
    run_files.write_json(str(tmp_path), "x.json", {"a": 1})
  assert sorted(os.listdir(tmp_path)) == ["x.json"]


@pytest.mark.parametrize("name,message", [
    (run_files.CHECKPOINTS, "holds checkpoints as a file, where the run "
     "writes its checkpoints folder; move it away."),
    (run_files.SUMMARY_JSON, "holds summary.json as a folder, where the run "
     "writes its summary.json; move it away.")])
def test_a_workdir_holding_the_wrong_kind_is_refused_first(tmp_path, name,
                                                           message):
  """Before the first write (it failed at the first checkpoint, or left a
  summary.json.tmp behind, exit 1)."""
  if name == run_files.CHECKPOINTS:
    (tmp_path / name).write_text("")
  else:
    (tmp_path / name).mkdir()
  with pytest.raises(UserError) as e:
    run_files.prepare(str(tmp_path))
  assert str(e.value) == f"--workdir={tmp_path} {message}"


def test_a_workdir_another_process_holds_is_refused(tmp_path):
  """Two runs in one workdir at once interleaved their checkpoints and
  results, both exiting 0; the second is refused, naming the first."""
  holder = subprocess.Popen(
      [sys.executable, "-c", (
          "import fcntl, sys, time\n"
          f"f = open({str(tmp_path / '.lock')!r}, 'a+')\n"
          "fcntl.flock(f, fcntl.LOCK_EX)\n"
          "f.write('12345'); f.flush(); print('held', flush=True)\n"
          "time.sleep(120)")], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError) as e:
      run_files.prepare(str(tmp_path))
    assert str(e.value) == (
        f"--workdir={tmp_path} is in use by another run (process 12345); "
        "wait for it to end, or pass another --workdir.")
  finally:
    holder.kill()
    holder.wait()
  run_files.prepare(str(tmp_path))  # Its lock went with its process.
  run_files.prepare(str(tmp_path))  # This process may come back to it.
  run_files.release(str(tmp_path))


def test_a_failed_model_save_leaves_the_old_model(tmp_path, monkeypatch):
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  path = run_files.save_model(str(tmp_path), model)
  before = (tmp_path / run_files.MODEL_FILE).read_bytes()

  def dies(self, filepath, *args, **kwargs):
    with open(filepath, "wb") as f:
      f.write(b"PK\x03\x04half a zip")
    raise _Died()
  monkeypatch.setattr(keras.Model, "save", dies)
  with pytest.raises(_Died):
    run_files.save_model(str(tmp_path), model)
  assert (tmp_path / run_files.MODEL_FILE).read_bytes() == before
  assert keras.models.load_model(path).count_params() == 8
  assert sorted(os.listdir(tmp_path)) == [run_files.MODEL_FILE]


def test_a_failed_weights_save_leaves_the_old_weights(tmp_path,
                                                     monkeypatch):
  """model.weights.h5 (a model Keras cannot save whole) is written as
  model.keras is: whole or not at all."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  name = run_files.WEIGHTS_FILE
  run_files.save_model(str(tmp_path), model, name)
  before = (tmp_path / name).read_bytes()

  def dies(self, filepath, *args, **kwargs):
    with open(filepath, "wb") as f:
      f.write(b"\x89HDF\r\nhalf a file")
    raise _Died()
  monkeypatch.setattr(keras.Model, "save_weights", dies)
  with pytest.raises(_Died):
    run_files.save_model(str(tmp_path), model, name)
  assert (tmp_path / name).read_bytes() == before
  assert sorted(os.listdir(tmp_path)) == [name]


def test_the_saved_file_replaces_the_other_kind(tmp_path):
  """A rerun whose model now saves whole (or no longer does) leaves one
  file, this run's: not an earlier run's of another model class."""
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  run_files.save_model(str(tmp_path), model, run_files.WEIGHTS_FILE)
  run_files.save_model(str(tmp_path), model)
  assert sorted(os.listdir(tmp_path)) == [run_files.MODEL_FILE]
  run_files.save_model(str(tmp_path), model, run_files.WEIGHTS_FILE)
  assert sorted(os.listdir(tmp_path)) == [run_files.WEIGHTS_FILE]


def test_config_changes_name_each_changed_key_once(tmp_path):
  workdir = str(tmp_path)
  assert run_config.config_changes(workdir, {"a": 1}) == ""  # No file yet.
  before = {"data": {"seq_len": 50, "name": "longmem"},
            "train": {"steps": 100, "shape": (1, 2)}, "gone": 1}
  run_files.write_json(workdir, run_files.CONFIG_JSON, before)
  assert run_config.config_changes(workdir, before) == ""  # Tuples as lists.
  now = {"data": {"seq_len": 30, "name": "longmem"},
         "train": {"steps": 200, "shape": (1, 2)}, "new": "x"}
  assert run_config.config_changes(workdir, now) == (
      "config changed since this workdir's last run: data.seq_len 50 -> 30, "
      "gone 1 -> null, new null -> \"x\", train.steps 100 -> 200 "
      "(config.json now holds this run's)")
  line = run_config.config_changes(workdir, now, shown=2)
  assert line.endswith("gone 1 -> null and 2 more (config.json now holds "
                       "this run's)")


@pytest.mark.parametrize("text,error", [("{not json", "JSONDecodeError"),
                                        ("[1, 2]", "AttributeError")])
def test_an_unreadable_config_json_is_said_before_it_is_replaced(
    tmp_path, text, error):
  (tmp_path / run_files.CONFIG_JSON).write_text(text)
  assert run_config.config_changes(str(tmp_path), {"a": 1}) == (
      f"this workdir's config.json is unreadable ({error}), so what changed "
      "since its last run is unknown (config.json now holds this run's)")


def test_what_prepare_made_goes_when_the_run_fails_before_writing(tmp_path):
  """The lock is taken before the model and data are checked (nothing
  may read the workdir before it): a run refused then removes the folders
  it made, or the lock file it added, and nothing else. release() knows
  what prepare() made: its caller does not pass it."""
  workdir = str(tmp_path / "new" / "run")
  created = run_files.prepare(workdir)
  assert created == str(tmp_path / "new")
  run_files.release(workdir, started=False)
  assert os.listdir(tmp_path) == []
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("the user's")
  created = run_files.prepare(str(tmp_path / "mine"))
  assert created == str(tmp_path / "mine" / ".lock")
  run_files.release(str(tmp_path / "mine"), started=False)
  assert os.listdir(tmp_path / "mine") == ["notes.txt"]
  run_files.prepare(workdir)
  (tmp_path / "new" / "run" / "config.json").write_text("{}")
  run_files.release(workdir, started=False)  # It wrote: all stays.
  assert sorted(os.listdir(tmp_path / "new" / "run")) == [".lock",
                                                          "config.json"]
  # A run that started keeps its lock file, in a folder that had none.
  run_files.prepare(str(tmp_path / "mine"))
  run_files.release(str(tmp_path / "mine"))
  assert sorted(os.listdir(tmp_path / "mine")) == [".lock", "notes.txt"]


# --- A new workdir whose run fails unexpectedly before its first checkpoint

class _FailsInTraining(keras.Model):
  """Its training call raises a Python error (found by the first step's
  trace: the checks before call it in inference); `fail=False`: fixed."""

  def __init__(self, fail=True):
    super().__init__(name="fails_in_training")
    self.out, self.fail = keras.layers.Dense(1), fail

  def call(self, x, training=False):
    if training and self.fail:
      raise RuntimeError("my call failed in training")
    return self.out(x)


def _failing(fail=True):
  def model_fn():
    model = _FailsInTraining(fail)
    model.compile(optimizer="sgd", loss="mse")
    return model
  return model_fn


_RUN = {"train.global_batch_size": 48, "train.log_every": 2,
        "train.checkpoint_every": 100, "eval.every": 0,
        "log.calibration_steps": 0, "log.peak_tflops": 1.0,
        "log.progress": False}


def test_a_run_failing_unexpectedly_at_step_1_leaves_no_workdir(tmp_path):
  """Nothing was trained: its config.json and TensorBoard's start-up
  events go with the folder it made (a rerun would take them for another
  run's), and the rerun with the model fixed and another config trains
  there as in a new folder."""
  import helpers  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "w"
  with pytest.raises(RuntimeError, match="my call failed in training"):
    helpers.fit_fns(_failing(), parity_task.dataset_fn, workdir,
                    dict(_RUN, **{"train.steps": 2}))
  assert not workdir.exists()
  result = helpers.fit_fns(_failing(fail=False), parity_task.dataset_fn,
                           workdir, dict(_RUN, **{"train.steps": 3}))
  assert result.summary["steps"] == 3
  assert len(helpers.event_files(str(workdir))) == 1


def test_a_run_failing_at_step_1_leaves_a_folder_there_before_as_it_was(
    tmp_path):
  """Its config.json stayed in the folder (over the one there before, or
  where there was none) with TensorBoard's start-up events: a rerun then
  compared itself with a run that trained nothing. Now the folder is as
  it was before the run, and the rerun with the model fixed trains there
  with events of its own only."""
  import helpers  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("the user's")
  run = dict(_RUN, **{"train.steps": 2})
  for before in (None, '{"train": {"steps": 7}}'):
    if before is not None:
      (workdir / run_files.CONFIG_JSON).write_text(before)
    with pytest.raises(RuntimeError, match="my call failed in training"):
      helpers.fit_fns(_failing(), parity_task.dataset_fn, workdir, run)
    assert sorted(os.listdir(workdir)) == sorted(
        ["notes.txt"] + ([run_files.CONFIG_JSON] if before else []))
    if before is not None:
      assert (workdir / run_files.CONFIG_JSON).read_text() == before
  result = helpers.fit_fns(_failing(fail=False), parity_task.dataset_fn,
                           workdir, dict(_RUN, **{"train.steps": 3}))
  assert result.summary["steps"] == 3
  assert len(helpers.event_files(str(workdir))) == 1
  with open(workdir / run_files.CONFIG_JSON, encoding="utf-8") as f:
    assert json.load(f)["train"]["steps"] == 3


class _FailsAtStep2(keras.Model):
  """Its training call fails at the second step, in TensorFlow."""

  def __init__(self):
    super().__init__(name="fails_at_step_2")
    self.out = keras.layers.Dense(1)
    self.calls = self.add_weight(shape=(), initializer="zeros",
                                 trainable=False)

  def call(self, x, training=False):
    if training:
      self.calls.assign_add(1.0)
      tf.debugging.assert_less(self.calls, 2.0, "second step")
    return self.out(x)


def test_a_run_failing_unexpectedly_after_a_step_keeps_its_events(
    tmp_path):
  """The events hold the curves up to the failure, to debug it with."""
  import helpers  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top

  def model_fn():
    model = _FailsAtStep2()
    model.compile(optimizer="sgd", loss="mse")
    return model

  with pytest.raises(tf.errors.InvalidArgumentError, match="second step"):
    helpers.fit_fns(model_fn, parity_task.dataset_fn, tmp_path / "w",
                    dict(_RUN, **{"train.steps": 4, "train.log_every": 1,
                                  "train.steps_per_loop": 1}))
  assert helpers.event_files(str(tmp_path / "w"))
  assert (tmp_path / "w" / run_files.CONFIG_JSON).exists()
