"""Keras callbacks under dist_keras, against Keras' fit.

An epoch is one eval interval; fit's reference runs epochs of the same
steps (steps_per_epoch = eval.every) on the same batches. Stopping, the
best model and the rate under 2 replicas and 2 workers: test_fit_parity.py.
"""
import functools
import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
from dist_keras.distribute import strategies
from dist_keras.errors import UserError

EPOCH, EPOCHS, EVAL_STEPS = 4, 6, 4
CONFIG = {"train.steps": EPOCH * EPOCHS, "train.global_batch_size": 48,
          "train.log_every": EPOCH, "train.checkpoint_every": EPOCH,
          "eval.every": EPOCH, "eval.steps": EVAL_STEPS,
          "log.progress": False, "log.calibration_steps": 0,
          "log.sync_timing": False, "log.peak_tflops": 1.0}
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")


def _fit(callbacks, model_fn=parity_task.callbacks_model):
  """Keras' fit: EPOCHS epochs of EPOCH steps, evaluated on EVAL_STEPS."""
  keras.utils.set_random_seed(0)
  model = model_fn()
  one = tf.distribute.InputContext()
  model.fit(parity_task.dataset_fn("train", one), epochs=EPOCHS,
            steps_per_epoch=EPOCH, verbose=0, shuffle=False,
            validation_data=parity_task.dataset_fn("eval", one),
            validation_steps=EVAL_STEPS, callbacks=callbacks)
  return model


def _ours(workdir, callbacks, strategy=ONE_CPU,
          model_fn=parity_task.callbacks_model,
          dataset_fn=parity_task.dataset_fn, **config):
  return dist_keras.fit(model_fn, dataset_fn, workdir=str(workdir),
                 config={**CONFIG, **config}, strategy=strategy,
                 callbacks=callbacks)


def _same_calls(got, want, rtol=0.0):
  assert [c[:3] for c in got] == [c[:3] for c in want]
  for (hook, _, _, logs), (_, _, _, expected) in zip(got, want):
    for key, value in expected.items():
      assert logs[key] == pytest.approx(value, rel=rtol, abs=rtol), hook


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  """Keras' fit and dist_keras on one device, each with a Recorder of its
  hooks and a _MetricsAtEpochBegin (it reads, changes nothing): three
  tests read the same two runs. {"fit": (model, recorder, reader), "ours":
  (result, recorder, reader)}."""
  runs = {}
  for name in ("fit", "ours"):
    calls, seen = parity_task.Recorder(), _MetricsAtEpochBegin()
    runs[name] = (_fit([calls, seen]) if name == "fit" else _ours(
        tmp_path_factory.mktemp("recorded"), [calls, seen]), calls, seen)
  return runs


def test_a_custom_callback_sees_fits_hooks_in_fits_order(recorded):
  """steps_per_execution=4 (epochs of one call, as the loop's) and an eval
  of 4 batches (one call): every hook, index, log key and value is fit's."""
  (fitted, fit_calls, _), (result, our_calls, _) = (recorded["fit"],
                                                    recorded["ours"])
  assert len(fit_calls.calls) == 2 + EPOCHS * 8
  _same_calls(our_calls.calls, fit_calls.calls)
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert result.history == {k: v for k, v in fitted.history.history.items()}


class _MetricsAtEpochBegin(keras.callbacks.Callback):
  """Reads the model's metrics as each epoch after the first begins (fit
  builds its compiled metrics at the first step: none to read before)."""

  def __init__(self):
    super().__init__()
    self.seen = []

  def on_epoch_begin(self, epoch, logs=None):
    if epoch:
      self.seen.append({k: float(v) for k, v in
                        self.model.get_metrics_result().items()})


def test_an_epochs_first_hook_sees_its_metrics_reset_as_under_fit(recorded):
  """fit resets the metrics before on_epoch_begin: a callback reading them
  there sees zeros, not the last eval's values."""
  fit_seen, our_seen = recorded["fit"][2], recorded["ours"][2]
  assert len(our_seen.seen) == EPOCHS - 1
  assert our_seen.seen == fit_seen.seen


def test_two_replicas_call_the_same_hooks_with_the_same_logs(tmp_path,
                                                             mirrored,
                                                             recorded):
  one, two = recorded["ours"][1], parity_task.Recorder()
  _ours(tmp_path / "two", [two], strategy=mirrored)
  _same_calls(two.calls, one.calls, rtol=1e-5)


def test_batch_hooks_run_once_per_call_with_the_epochs_running_values(
    tmp_path):
  """Steps run 2 a call (train.steps_per_loop=2): a batch hook per call,
  its index the call's last step in the epoch, as under fit's
  steps_per_execution; the logs are the epoch's running means."""
  calls = parity_task.Recorder()
  _ours(tmp_path, [calls], model_fn=parity_task.plain,
        **{"train.steps_per_loop": 2})
  ends = [(i, logs) for hook, i, _, logs in calls.calls
          if hook == "on_train_batch_end"]
  assert [i for i, _ in ends] == [1, 3] * EPOCHS
  epoch_ends = [logs for hook, _, _, logs in calls.calls
                if hook == "on_epoch_end"]
  for (_, batch_logs), epoch_logs in zip(ends[1::2], epoch_ends):
    assert batch_logs["loss"] == pytest.approx(epoch_logs["loss"])


class _StopAfterBatch(keras.callbacks.Callback):
  """Stops training at the end of batch `last` (no logs read)."""

  def __init__(self, last):
    super().__init__()
    self.last, self.seen = last, []

  def on_train_batch_end(self, batch, logs=None):
    self.seen.append(batch)
    if batch >= self.last:
      self.model.stop_training = True


def test_batch_hooks_see_every_step_when_calls_are_sized_by_time(
    tmp_path, capsys):
  """The default train.steps_per_loop=0 and steps_per_execution=1: a
  callback with batch hooks gets every batch and stops where fit stops,
  mid log window (steps sized by time had skipped batches 10-17)."""
  keras.utils.set_random_seed(0)
  fitted, want = parity_task.plain(), _StopAfterBatch(13)
  fitted.fit(parity_task.dataset_fn("train", tf.distribute.InputContext()),
             epochs=1, steps_per_epoch=24, verbose=0, shuffle=False,
             callbacks=[want])
  got = _StopAfterBatch(13)
  result = _ours(tmp_path, [got], model_fn=parity_task.plain,
                 **{"train.log_every": 10, "eval.every": 0,
                    "log.progress": True})
  assert got.seen == want.seen == list(range(14))
  assert "steps per call: 1 (a callback has batch hooks" in (
      capsys.readouterr().out)
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("last_batch", [13, 5])
def test_a_stop_mid_window_reports_the_last_steps(tmp_path, capsys,
                                                  last_batch):
  """The window a stop cuts short is logged (its line, TensorBoard) before
  the eval, and summary.json's train values are its: they were the window
  before's (batch 13), or missing (batch 5, before the first window)."""
  result = _ours(tmp_path, [_StopAfterBatch(last_batch)],
                 model_fn=parity_task.plain,
                 **{"train.log_every": 10, "eval.every": 0,
                    "log.progress": True, "log.tensorboard": True})
  step = last_batch + 1
  lines = capsys.readouterr().out.splitlines()
  logged = [i for i, line in enumerate(lines)
            if line.startswith(f"step {step:2d}/24  loss ")]
  evaluated = [i for i, line in enumerate(lines)
               if line.startswith(f"eval at step {step}:")]
  assert logged and evaluated and logged[0] < evaluated[0], lines
  losses = dict(helpers.scalar_tags(str(tmp_path))["loss"])
  assert result.summary["steps"] == step
  assert result.summary["train_loss"] == pytest.approx(losses[step])


def test_a_reduced_rate_reaches_every_replica_and_the_checkpoint(tmp_path,
                                                                mirrored):
  reduce = keras.callbacks.ReduceLROnPlateau(monitor="val_loss",
                                             min_delta=1e9, patience=0,
                                             factor=0.5)
  result = _ours(tmp_path, [reduce], strategy=mirrored)
  rate = result.model.optimizer._learning_rate  # pylint: disable=protected-access
  expected = float(rate.numpy())
  assert expected < 0.05 / 8  # Halved at every epoch but the first.
  for value in mirrored.experimental_local_results(rate.value):
    assert float(value) == expected
  reader = tf.train.load_checkpoint(os.path.join(tmp_path, "checkpoints"))
  assert any(name.startswith("optimizer_variables/")
             and np.ndim(reader.get_tensor(name)) == 0
             and reader.get_tensor(name) == np.float32(expected)
             for name in reader.get_variable_to_shape_map())


def test_learning_rate_scheduler_trains_what_fit_trains(tmp_path):
  def scheduler():
    return keras.callbacks.LearningRateScheduler(
        lambda epoch, rate: 0.1 / (epoch + 1))

  fitted = _fit([scheduler()], model_fn=parity_task.plain)
  ours = _ours(tmp_path, [scheduler()], model_fn=parity_task.plain)
  for a, b in zip(fitted.get_weights(), ours.model.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert ours.history["learning_rate"] == pytest.approx(
      fitted.history.history["learning_rate"])


def _every_copy(model, strategy) -> list:
  """Each replica's copy of every variable of the model (its seeds too),
  of its metrics and of its optimizer."""
  variables = [*model.variables, *model.metrics_variables,
               *model.optimizer.variables]
  return [copy.numpy() for v in variables
          for copy in strategy.experimental_local_results(v.value)]


@pytest.mark.parametrize("replicas", [1, 2])
def test_calibration_leaves_the_model_as_training_left_it(
    tmp_path, mirrored, capsys, replicas):
  """The calibration's passes in training mode (after the last step, no
  update) moved the BatchNormalization's moving statistics (one copy per
  replica), Dropout's seed and the per-output loss trackers: the model
  returned and saved was not the one trained, nor the one summary.json's
  eval is of, and a run with a callback said the callback had set other
  weights. (2 epochs: the calibration follows the last step, whichever.)"""
  strategy = mirrored if replicas == 2 else ONE_CPU
  runs = [_ours(tmp_path / str(steps), [keras.callbacks.Callback()],
                strategy=strategy, model_fn=parity_task.batch_norm,
                dataset_fn=parity_task.two_output_dataset_fn,
                **{"log.calibration_steps": steps, "log.progress": True,
                   "train.steps": 2 * EPOCH})
          for steps in (0, 3)]
  assert runs[1].summary["ideal_step_ms"] > 0  # It ran.
  for trained, calibrated in zip(_every_copy(runs[0].model, strategy),
                                 _every_copy(runs[1].model, strategy)):
    np.testing.assert_array_equal(trained, calibrated)
  assert "a callback set other weights" not in capsys.readouterr().out
  saved = keras.models.load_model(tmp_path / "3" / "model.keras")
  for trained, kept in zip(runs[0].model.get_weights(), saved.get_weights()):
    np.testing.assert_array_equal(trained, kept)


def _tags(folder) -> set:
  """RUN/TAG of every summary in the event files under `folder`."""
  tags = set()
  for path in helpers.event_files(str(folder)):
    run = os.path.relpath(os.path.dirname(path), folder)
    for event in tf.compat.v1.train.summary_iterator(path):
      tags |= {f"{run}/{value.tag}" for value in event.summary.value}
  return tags


@pytest.mark.parametrize("ours, update_freq", [(False, "batch"), (True, 3)])
def test_a_tensorboard_callbacks_folder_holds_keras_tags_alone(
    tmp_path, ours, update_freq):
  """Keras' TensorBoard with batch summaries makes its writer the default
  between its hooks and records every update_freq-th batch only: with
  log.tensorboard=false dist_keras' loss, eval/, perf/ and sync/ tags went
  into its train/ run (the no-op writer left its writer the default); with
  true, dist_keras' own points were dropped where it did not record."""
  tb = tmp_path / "tb"
  _ours(tmp_path / "run", [keras.callbacks.TensorBoard(
      str(tb), update_freq=update_freq)], **{"log.tensorboard": ours,
                                             "log.sync_timing": True})
  tags = _tags(tb)
  assert {"train/batch_loss", "train/epoch_loss",
          "validation/epoch_loss"} <= tags
  assert all(tag.split("/")[1].startswith(("batch_", "epoch_", "evaluation_"))
             or tag == "train/keras" for tag in tags), tags
  ours_tags = helpers.scalar_tags(str(tmp_path / "run"))
  assert bool(ours_tags) == ours
  if ours:
    every_epoch = [EPOCH * (i + 1) for i in range(EPOCHS)]
    for tag in ("loss", "eval/loss", "sync/compute_ms"):
      assert [step for step, _ in ours_tags[tag]] == every_epoch, tag
    assert not [t for t in ours_tags if t.startswith(("batch_", "epoch_"))]


def _file_writers(tmp_path):
  return [keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
          keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb")),
          keras.callbacks.ModelCheckpoint(str(tmp_path / "last.keras"))]


def test_file_writing_callbacks_write_where_the_chief_writes(tmp_path):
  _ours(tmp_path / "run", _file_writers(tmp_path))
  with open(tmp_path / "log.csv", encoding="utf-8") as f:
    rows = f.read().splitlines()
  assert rows[0].split(",") == ["epoch", "loss", "mae", "val_loss",
                                "val_mae"]
  assert len(rows) == 1 + EPOCHS
  assert helpers.event_files(str(tmp_path / "tb"))
  assert keras.models.load_model(tmp_path / "last.keras")


def test_other_workers_write_their_callbacks_files_to_scratch(
    tmp_path, monkeypatch):
  """Until the run ends: then the user's callback objects write where
  they did again (a notebook's Keras fit with them next: not in the
  deleted scratch folder)."""
  monkeypatch.setattr(strategies, "is_chief", lambda strategy: False)
  callbacks = _file_writers(tmp_path)
  _ours(tmp_path / "run", callbacks)
  assert not any(os.path.exists(tmp_path / name)
                 for name in ("log.csv", "tb", "last.keras"))
  assert [callbacks[0].filename, callbacks[1].log_dir,
          callbacks[2].filepath] == [
              str(tmp_path / n) for n in ("log.csv", "tb", "last.keras")]


def test_terminate_on_nan_is_met_by_the_loops_own_divergence_check(
    tmp_path):
  """A non-finite loss stops the loop before any callback sees it: exit 3,
  the last good checkpoint kept (TerminateOnNaN would stop it too)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top

  def exploding():
    model = parity_task.plain()
    model.optimizer.learning_rate = 1e30
    return model

  with pytest.raises(errors.Diverged, match="training diverged"):
    _ours(tmp_path, [keras.callbacks.TerminateOnNaN()], model_fn=exploding)


def test_a_stopped_run_is_not_trained_further_when_rerun(tmp_path, capsys):
  stop = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e9,
                                       patience=1)
  first = _ours(tmp_path, [stop], **{"log.progress": True})
  assert first.summary["stopped_early"] and first.summary["steps"] == 2 * EPOCH
  capsys.readouterr()
  again = _ours(tmp_path, [], **{"log.progress": True,
                                 "train.steps": 2 * EPOCH * EPOCHS})
  out = capsys.readouterr().out
  assert "nothing left to train" in out
  assert (f"already finished at step {2 * EPOCH} (a callback stopped it): "
          "its summary.json and model.keras are kept as that run wrote them "
          "(pass a new workdir to train again)") in out, out
  assert again.summary["steps"] == 2 * EPOCH and again.summary["stopped_early"]


def _best_restored():
  """Its best epoch is the worst one (mode="max"): the weights it restores
  when training ends are not the last step's."""
  return keras.callbacks.EarlyStopping(monitor="val_loss", mode="max",
                                       patience=EPOCHS,
                                       restore_best_weights=True)


@pytest.fixture(scope="module")
def best_restored(tmp_path_factory):
  """One device's run with _best_restored() and a CSVLogger (it only
  writes its file), its progress printed: three tests read it (a rerun
  goes on in a copy). {"result", "run": its workdir, "log": the CSV}."""
  folder = tmp_path_factory.mktemp("best_restored")
  log = folder / "log.csv"
  result = _ours(folder / "run", [_best_restored(),
                                  keras.callbacks.CSVLogger(str(log))],
                 **{"log.progress": True})
  return {"result": result, "run": folder / "run", "log": log}


def test_restored_best_weights_are_saved_reported_and_fits(best_restored):
  fitted = _fit([_best_restored()])
  result = best_restored["result"]
  best = max(result.history["val_loss"])
  assert best > result.history["val_loss"][-1]
  assert result.summary["eval_loss"] == pytest.approx(best, rel=1e-6)
  saved = keras.models.load_model(best_restored["run"] / "model.keras")
  for want, ours, kept in zip(fitted.get_weights(),
                              result.model.get_weights(), saved.get_weights()):
    np.testing.assert_array_equal(ours, want)
    np.testing.assert_array_equal(kept, want)


def _ema_model():
  return parity_task._compiled(  # pylint: disable=protected-access
      keras.optimizers.SGD(0.05, use_ema=True), steps_per_execution=4)


@pytest.fixture(scope="module")
def swapped_ema(tmp_path_factory):
  """`(swap_on_epoch) -> dist_keras' run` of _ema_model with
  SwapEMAWeights, one device, made on first use (two tests read True's)."""
  folder = tmp_path_factory.mktemp("swapped_ema")
  return functools.cache(lambda swap_on_epoch: _ours(
      folder / str(swap_on_epoch), [keras.callbacks.SwapEMAWeights(
          swap_on_epoch=swap_on_epoch)], model_fn=_ema_model))


@pytest.mark.parametrize("swap_on_epoch", [False, True])
def test_swap_ema_weights_evaluates_and_trains_what_fit_does(swapped_ema,
                                                             swap_on_epoch):
  fitted = _fit([keras.callbacks.SwapEMAWeights(swap_on_epoch=swap_on_epoch)],
                model_fn=_ema_model)
  ours = swapped_ema(swap_on_epoch)
  assert ours.history["val_loss"] == pytest.approx(
      fitted.history.history["val_loss"], rel=1e-6)
  for a, b in zip(fitted.get_weights(), ours.model.get_weights()):
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("two_replicas", [False, True])
def test_rerunning_a_finished_workdir_keeps_its_results(tmp_path, capsys,
                                                        mirrored, request,
                                                        two_replicas):
  """summary.json, model.keras (the best epoch's, not the checkpoint's)
  and a CSVLogger's file stay as the run that trained wrote them."""
  log = tmp_path / "log.csv"
  run = tmp_path / "run"
  strategy = mirrored if two_replicas else ONE_CPU
  if two_replicas:
    first = _ours(run, [_best_restored(),
                        keras.callbacks.CSVLogger(str(log))],
                  strategy=strategy, **{"log.progress": True})
  else:  # One device's is the shared run (rerun in a copy).
    shared = request.getfixturevalue("best_restored")
    shutil.copytree(shared["run"], run)
    shutil.copy(shared["log"], log)
    first = shared["result"]
  files = {name: (run / name).read_bytes()
           for name in ("summary.json", "model.keras", "config.json")}
  csv = log.read_bytes()
  capsys.readouterr()
  again = _ours(run, [keras.callbacks.CSVLogger(str(log))],
                strategy=strategy, **{"log.progress": True})
  out = capsys.readouterr().out
  assert ("already finished at step 24 (train.steps reached): its "
          "summary.json and model.keras are kept") in out, out
  assert again.summary == first.summary
  assert {name: (run / name).read_bytes() for name in files} == files
  assert log.read_bytes() == csv
  for a, b in zip(first.model.get_weights(), again.model.get_weights()):
    np.testing.assert_array_equal(a, b)


def _killed_after_its_last_checkpoint(workdir):
  """What a SIGKILL (or a second Ctrl-C) after the last step's checkpoint
  leaves: the checkpoints, config.json and the events, no summary.json and
  no model.keras (seen from the command line: docs/correctness.md)."""
  os.remove(workdir / "summary.json")
  os.remove(workdir / "model.keras")


@pytest.mark.parametrize("two_replicas", [False, True])
def test_a_run_killed_before_its_results_is_finished_by_the_rerun(
    tmp_path, capsys, mirrored, two_replicas):
  """The rerun evaluates the checkpoint and writes what the run would have
  written: its train values and measurements are the checkpoint's (they
  were missing); the calibration, which runs after the last checkpoint, is
  null and named, in summary.json and in one line."""
  config = {"log.sync_timing": True, "log.calibration_steps": 2}
  strategy = mirrored if two_replicas else ONE_CPU
  first = _ours(tmp_path, [], strategy=strategy, **config)
  _killed_after_its_last_checkpoint(tmp_path)
  capsys.readouterr()
  again = _ours(tmp_path, [], strategy=strategy,
                **{**config, "log.progress": True})
  out = capsys.readouterr().out
  assert "already finished" not in out
  assert f"eval at step {EPOCH * EPOCHS}" in out
  calibration = sorted(k for k in first.summary if k != "allreduce_ms"
                       and k.startswith(("ideal_", "allreduce_", "call_")))
  unknown = [k for k in calibration if not (
      k == "allreduce_predicted_ms" and not two_replicas)]  # 0.0: known.
  assert "train_loss" in first.summary and "allreduce_predicted_ms" in (
      first.summary)
  assert again.summary["finished_by_rerun"] == {
      "checkpoint": f"ckpt-{EPOCH * EPOCHS}", "not_known": unknown}
  assert set(again.summary) == set(first.summary) | {"finished_by_rerun"}
  for key, value in first.summary.items():
    if key in unknown:
      assert again.summary[key] is None, key
    elif key.startswith("eval_"):
      assert again.summary[key] == pytest.approx(value, rel=1e-6), key
    else:  # The train values and what the run measured, as it had them.
      assert again.summary[key] == value, key
  assert (f"results written by this rerun for ckpt-{EPOCH * EPOCHS}") in out
  assert f"not known (null in summary.json): {', '.join(unknown)}" in out
  with open(tmp_path / "summary.json", encoding="utf-8") as f:
    assert json.load(f) == json.loads(json.dumps(again.summary))
  for a, b in zip(first.model.get_weights(),
                  keras.models.load_model(tmp_path / "model.keras")
                  .get_weights()):
    np.testing.assert_array_equal(a, b)


class _Killed(Exception):
  """A process killed: nothing after it runs (not even a checkpoint)."""


class _KillAtEpoch(keras.callbacks.Callback):
  """Kills the run as epoch `epoch` begins: the checkpoint of the epoch
  before was saved, nothing after it."""

  def __init__(self, epoch):
    super().__init__()
    self.epoch = epoch

  def on_epoch_begin(self, epoch, logs=None):
    if epoch == self.epoch:
      raise _Killed


class _EpochCounter(keras.callbacks.Callback):
  """A callback of its own state (dist_keras cannot know what to keep)."""

  def __init__(self):
    super().__init__()
    self.epochs = 0

  def on_epoch_end(self, epoch, logs=None):
    self.epochs += 1


def test_early_stopping_keeps_its_best_weights_over_a_resume(tmp_path,
                                                             capsys,
                                                             best_restored):
  """Killed after epoch 2's checkpoint and rerun: its best value, patience
  count and best weights are the checkpoint's, so it restores the weights
  an uninterrupted run restores (its best epoch is before the kill); a
  callback of its own state is named in one line as not kept."""
  whole = best_restored["result"]
  with pytest.raises(_Killed):
    _ours(tmp_path / "cut", [_best_restored(), _KillAtEpoch(2)])
  capsys.readouterr()
  counter = _EpochCounter()
  again = _ours(tmp_path / "cut", [_best_restored(), counter],
                **{"log.progress": True})
  out = capsys.readouterr().out
  [line] = [x for x in out.splitlines() if x.startswith("callbacks over")]
  assert line.startswith("callbacks over the resume: kept EarlyStopping "
                         "(wait=1, best="), line
  assert line.endswith("; not kept: _EpochCounter (its own attributes start "
                       "as new)"), line
  assert counter.epochs == EPOCHS - 2
  assert again.summary["eval_loss"] == whole.summary["eval_loss"]
  saved = keras.models.load_model(tmp_path / "cut" / "model.keras")
  for want, ours, kept in zip(whole.model.get_weights(),
                              again.model.get_weights(), saved.get_weights()):
    np.testing.assert_array_equal(ours, want)
    np.testing.assert_array_equal(kept, want)
  # Killed again, after its last checkpoint: the rerun that writes its
  # results restores the best weights too (the last step's are in ckpt-24).
  _killed_after_its_last_checkpoint(tmp_path / "cut")
  finished = _ours(tmp_path / "cut", [_best_restored()])
  assert finished.summary["eval_loss"] == whole.summary["eval_loss"]
  for want, ours in zip(whole.model.get_weights(),
                        finished.model.get_weights()):
    np.testing.assert_array_equal(ours, want)


def test_swapped_ema_weights_are_swapped_back_after_a_resume(tmp_path,
                                                             swapped_ema):
  """SwapEMAWeights(swap_on_epoch=True) holds the averages in the model at
  an epoch's end, when the checkpoint is saved; after a resume it swaps
  them back as the next epoch begins, as an uninterrupted run does."""
  def swap():
    return keras.callbacks.SwapEMAWeights(swap_on_epoch=True)

  whole = swapped_ema(True)
  with pytest.raises(_Killed):
    _ours(tmp_path / "cut", [swap(), _KillAtEpoch(2)], model_fn=_ema_model)
  again = _ours(tmp_path / "cut", [swap()], model_fn=_ema_model)
  for a, b in zip(whole.model.get_weights(), again.model.get_weights()):
    np.testing.assert_array_equal(b, a)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """`(workdir) -> the run`: one device's plain run (no callbacks), made
  once, its finished workdir copied to `workdir` for each test's rerun."""
  folder = tmp_path_factory.mktemp("finished") / "run"
  first = _ours(folder, [])

  def copied(workdir):
    shutil.copytree(folder, workdir)
    return first

  return copied


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_model_keras_is_written_again_by_the_rerun(tmp_path,
                                                             capsys, damage,
                                                             finished):
  """A finished workdir whose model.keras does not read back is finished
  again from its last checkpoint (it was an exit 1 on every rerun)."""
  workdir = tmp_path / "run"  # A copy of the shared run.
  first = finished(workdir)
  path = workdir / "model.keras"
  saved = path.read_bytes()
  path.write_bytes(saved[:len(saved) // 2] if damage == "truncated"
                   else b"not a zip")
  capsys.readouterr()
  again = _ours(workdir, [], **{"log.progress": True})
  assert ("model.keras does not read back (a damaged file): this rerun "
          "evaluates the last checkpoint and writes it again") in (
              capsys.readouterr().out)
  assert again.summary["eval_loss"] == pytest.approx(first.summary["eval_loss"])
  loaded = keras.models.load_model(path)
  for a, b in zip(first.model.get_weights(), loaded.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_a_finished_workdirs_rerun_says_what_it_did_not_apply(tmp_path,
                                                              capsys,
                                                              finished):
  workdir = tmp_path / "run"  # A copy of the shared run.
  finished(workdir)
  capsys.readouterr()
  _ours(workdir, [], **{"log.progress": True, "log.calibration_steps": 5})
  assert ("config changed since this workdir's last run: "
          "log.calibration_steps 0 -> 5, log.progress false -> true (not "
          "applied: the workdir's run had finished, and its config.json is "
          "kept)") in capsys.readouterr().out
  with open(workdir / "config.json", encoding="utf-8") as f:
    assert json.load(f)["log"]["calibration_steps"] == 0


class _BatchEnds(keras.callbacks.Callback):
  def on_train_batch_end(self, batch, logs=None):
    del batch, logs  # Its hook makes the run's calls one step each.


def _config_json(workdir) -> dict:
  with open(workdir / "config.json", encoding="utf-8") as f:
    return json.load(f)


def test_config_json_holds_what_was_asked_not_the_steps_per_call_chosen(
    tmp_path, capsys):
  """A callback's batch hooks make the calls one step each (asked:
  train.steps_per_loop=0, automatic): config.json keeps the 0, and the
  rerun without that callback names no key the user did not change."""
  _ours(tmp_path, [_BatchEnds()], model_fn=parity_task.plain,
        **{"train.steps": EPOCH})
  assert _config_json(tmp_path)["train"]["steps_per_loop"] == 0
  capsys.readouterr()
  _ours(tmp_path, [], model_fn=parity_task.plain,
        **{"train.steps": 2 * EPOCH, "log.progress": True})
  assert ("config changed since this workdir's last run: log.progress "
          f"false -> true, train.steps {EPOCH} -> {2 * EPOCH} (config.json "
          "takes this run's with its first checkpoint)\n") in (
              capsys.readouterr().out)


def test_a_rerun_failing_before_its_first_checkpoint_leaves_config_json(
    tmp_path, capsys):
  """config.json is of the run the checkpoints are of: a rerun (other
  values) that fails before saving one leaves the earlier run's, which the
  next rerun compares itself with; its first checkpoint writes its own."""

  class Fails(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      raise RuntimeError("a bug in my callback")

  _ours(tmp_path, [], model_fn=parity_task.plain, **{"train.steps": EPOCH})
  with pytest.raises(RuntimeError, match="a bug in my callback"):
    _ours(tmp_path, [Fails()], model_fn=parity_task.plain,
          **{"train.steps": 3 * EPOCH, "eval.steps": 2})
  assert _config_json(tmp_path)["train"]["steps"] == EPOCH
  capsys.readouterr()
  _ours(tmp_path, [], model_fn=parity_task.plain,
        **{"train.steps": 2 * EPOCH, "log.progress": True})
  assert ("config changed since this workdir's last run: log.progress "
          f"false -> true, train.steps {EPOCH} -> {2 * EPOCH} (config.json "
          "takes") in capsys.readouterr().out
  assert _config_json(tmp_path)["train"]["steps"] == 2 * EPOCH


@pytest.mark.parametrize("callbacks,message", [
    ([keras.callbacks.BackupAndRestore("/tmp/backup")],
     r"callbacks\[0\] is keras.callbacks.BackupAndRestore, but dist_keras "
     "already resumes"),
    (["EarlyStopping"], r"callbacks\[0\] is a str, not a "
     "keras.callbacks.Callback"),
    ([keras.callbacks.SwapEMAWeights()], r"callbacks\[0\] is "
     r"keras.callbacks.SwapEMAWeights, but the model's optimizer \(SGD\) has "
     "use_ema=False; compile with use_ema=True, or remove it."),
])
def test_callbacks_that_cannot_work_are_refused_before_anything_is_written(
    tmp_path, callbacks, message):
  with pytest.raises(UserError, match=message):
    _ours(tmp_path / "run", callbacks)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("callback", [
    keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0),
    keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)],
                         ids=lambda c: type(c).__name__)
def test_a_callback_setting_a_schedules_rate_is_refused_at_the_start(
    tmp_path, callback):
  """Keras cannot set a LearningRateSchedule's rate: its fit, and the run
  before this check, failed with a TypeError at the callback's first
  change of the rate, an epoch or more into training."""
  with pytest.raises(UserError, match=(
      rf"^callbacks\[0\] is keras.callbacks.{type(callback).__name__}, "
      r"which sets the learning rate, but the model's optimizer \(Adam\) "
      r"takes its rate from a LearningRateSchedule \(ExponentialDecay\), "
      r"which Keras cannot set .*; compile the optimizer with a float "
      r"learning_rate, or remove the callback.$")):
    _ours(tmp_path / "run", [callback], model_fn=parity_task.schedule)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("factory,message", [
    ("parity_task:callbacks_of_an_argument",
     "train.callbacks 'callbacks_of_an_argument' cannot be called as "
     r"train.callbacks\(\) \(missing a required argument: 'patience'\)"),
    ("parity_task:no_list_of_callbacks",
     "the callbacks are a int, not a list of keras callbacks; pass")])
def test_a_bad_callbacks_function_is_one_line(tmp_path, factory, message):
  with pytest.raises(UserError, match=message):
    _ours(tmp_path / "run", None, **{"train.callbacks": factory})
  assert not os.path.exists(tmp_path / "run")


def test_callbacks_passed_both_ways_are_refused(tmp_path):
  with pytest.raises(UserError, match="pass them one way"):
    _ours(tmp_path / "run", [parity_task.Recorder()],
          **{"train.callbacks": "parity_task:callbacks_fn"})


def test_train_callbacks_names_them_on_the_command_line(tmp_path):
  """train.callbacks=parity_task:callbacks_fn: EarlyStopping stops the run,
  ModelCheckpoint keeps the best model ($PARITY_BEST)."""
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path / 'run'}",
       "--config.model.name=parity_task:callbacks_model",
       "--config.data.name=parity_task:dataset_fn",
       "--config.train.callbacks=parity_task:callbacks_fn",
       *[f"--config.{k}={v}" for k, v in CONFIG.items()],
       "--config.train.steps=40", "--config.runtime.strategy=one_device"],
      env={"PYTHONPATH": f"{helpers.REPO}:{helpers.TESTS}",
           "PARITY_BEST": str(tmp_path / "best.keras")})
  assert result.returncode == 0, result.stderr[-2000:]
  with open(tmp_path / "run" / "summary.json", encoding="utf-8") as f:
    summary = json.load(f)
  assert summary["stopped_early"] and summary["steps"] < 40
  assert summary["callbacks"] == ["EarlyStopping", "ReduceLROnPlateau",
                                  "ModelCheckpoint"]
  assert os.path.exists(tmp_path / "best.keras")


def test_a_models_own_test_step_evaluates(tmp_path):
  result = _ours(tmp_path, None, model_fn=parity_task.custom_test_step)
  assert "eval_abs_error_max" in result.summary
  # Its logs alone, as evaluate() reports them (not the loss tracker's 0).
  assert not {"eval_loss", "val_loss"} & {*result.summary, *result.history}
  assert int(result.model.evals.numpy()) > 0
