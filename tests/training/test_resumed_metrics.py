"""A run stopped mid-epoch (SIGTERM) and rerun reports what the
uninterrupted run reports: the epoch's train values (History, a callback's
batch and epoch logs) and an EarlyStopping's decision on them, and the log
windows after the resume (TensorBoard, the progress lines). The checkpoint
keeps the epoch's metric state and the last window's end (metrics.py,
run_record.py); one saved without them resumes as before, saying so."""
import re
import signal

import keras
import pytest
import tensorflow as tf

import dist_keras
import parity_task
import user_task
from dist_keras import errors
from dist_keras.training import run_record

ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")
EPOCH, STOPPED_AT = 8, 5  # Mid-epoch 0 and mid-window (windows of 2).
CONFIG = {"train.steps": 4 * EPOCH, "eval.every": EPOCH,
          "train.log_every": 2, "train.checkpoint_every": 100,
          "train.steps_per_loop": 1, "train.global_batch_size": 48,
          "log.calibration_steps": 0, "log.peak_tflops": 1.0,
          "log.progress": True}
# Epoch 0's loss is far above epoch 1's, epoch 2's close to epoch 1's:
# EarlyStopping stops after epoch 2 (step 24). Epoch 0's values counted
# from the resumed step only (steps 6-8) came close to epoch 1's: it
# stopped after epoch 1 (step 16).
MIN_DELTA = 0.1


class _StopAt(keras.callbacks.Callback):
  """A SIGTERM after step `step`: the run saves a checkpoint and stops."""

  def __init__(self, step):
    super().__init__()
    self.step, self.steps = step, 0

  def on_train_batch_end(self, batch, logs=None):
    self.steps += 1
    if self.steps == self.step:
      signal.raise_signal(signal.SIGTERM)


def _run(workdir, model_fn, dataset_fn, strategy, capsys, extra=()):
  """(result, recorded epoch and batch ends, stdout)."""
  recorder = parity_task.Recorder()
  capsys.readouterr()
  result = dist_keras.fit(
      model_fn, dataset_fn, workdir=str(workdir), config=CONFIG,
      strategy=strategy, callbacks=[
          keras.callbacks.EarlyStopping(monitor="loss", min_delta=MIN_DELTA,
                                        patience=0), recorder, *extra])
  ends = [c for c in recorder.calls
          if c[0] in ("on_train_batch_end", "on_epoch_end")]
  return result, ends, capsys.readouterr().out


def _progress(out: str) -> dict:
  """{step: {name: value}} of the progress lines' train values."""
  found = {}
  for step, values in re.findall(r"step +(\d+)/\d+  (.*?)  (?:[\d,]+ ex/s|"
                                 r"\(warm-up\))", out):
    pairs = values.split()
    found[int(step)] = {k: float(v) for k, v in zip(pairs[::2], pairs[1::2])}
  return found


def _same(got, want, rtol, atol=0.0):
  if rtol:
    assert got == pytest.approx(want, rel=rtol, abs=atol)
  else:
    assert got == want


@pytest.mark.parametrize("model_fn,dataset_fn,strategy,rtol,stops_at", [
    (user_task.model_fn, user_task.dataset_fn, "one", 0.0, 3 * EPOCH),
    # A model's own train_step, its metrics updated by itself.
    (parity_task.custom_step, parity_task.dataset_fn, "one", 0.0, None),
    (user_task.model_fn, user_task.dataset_fn, "mirrored", 1e-6, 3 * EPOCH),
])
def test_a_run_resumed_mid_epoch_reports_the_uninterrupted_runs_values(
    tmp_path, capsys, request, model_fn, dataset_fn, strategy, rtol,
    stops_at):
  strategy = (ONE_CPU if strategy == "one"
              else request.getfixturevalue("mirrored"))
  args = (model_fn, dataset_fn, strategy, capsys)
  whole, whole_ends, whole_out = _run(tmp_path / "whole", *args)
  with pytest.raises(errors.Preempted, match=f"after step {STOPPED_AT};"):
    _run(tmp_path / "cut", *args, extra=[_StopAt(STOPPED_AT)])
  again, ends, out = _run(tmp_path / "cut", *args)
  assert "resumed from ckpt-5" in out and "count only" not in out
  assert again.summary["steps"] == whole.summary["steps"]
  if stops_at:  # The test's premise: EarlyStopping stops on epoch values.
    assert whole.summary["steps"] == stops_at
    assert whole.summary["stopped_early"] and again.summary["stopped_early"]
  # Resumed in epoch 0: its History has every epoch.
  assert again.history.keys() == whole.history.keys()
  for key, values in whole.history.items():
    _same(again.history[key], values, rtol)
  # Every batch end and epoch end after the resume: its running values.
  assert [c[:3] for c in ends] == [c[:3] for c in whole_ends[-len(ends):]]
  for got, want in zip(ends, whole_ends[-len(ends):]):
    _same(got[3], want[3], rtol)
  # The first window after the resume (steps 5-6) too, and every one after.
  lines, whole_lines = _progress(out), _progress(whole_out)
  assert min(lines) == STOPPED_AT + 1
  for step, values in lines.items():
    assert values == pytest.approx(whole_lines[step], abs=1.5e-4), step
  tags = [dist_keras.tensorboard_events.read_scalars(str(tmp_path / name))
          for name in ("whole", "cut")]
  names = [name for name in tags[0] if name in whole.history]
  assert names
  for name in names:
    got = [(s, v) for s, v in tags[1][name] if s > STOPPED_AT]
    want = [(s, v) for s, v in tags[0][name] if s > STOPPED_AT]
    assert [s for s, _ in got] == [s for s, _ in want], name
    # A window's value is the difference of two epoch totals (metrics.py):
    # under 2 replicas each replica goes on from half the total, which
    # rounds the totals differently, by 1e-6 of the epoch's value (an
    # absolute 1e-6 here), not of the window's.
    _same([v for _, v in got], [v for _, v in want], rtol, atol=rtol)


def test_a_checkpoint_without_metric_state_resumes_saying_so(
    tmp_path, capsys, monkeypatch):
  """Saved by a dist_keras that kept no metric state: the run resumes,
  its resumed epoch's values counting the steps after the resume only,
  in one line."""
  snapshot = run_record.Keep._snapshot  # pylint: disable=protected-access

  def without_metrics(self):
    record, arrays = snapshot(self)
    record.pop("metrics", None)
    return record, {k: v for k, v in arrays.items()
                    if not k.startswith("metrics.")}

  args = (user_task.model_fn, user_task.dataset_fn, ONE_CPU, capsys)
  with monkeypatch.context() as patched, pytest.raises(errors.Preempted):
    patched.setattr(run_record.Keep, "_snapshot", without_metrics)
    _run(tmp_path, *args, extra=[_StopAt(STOPPED_AT)])
  again, _, out = _run(tmp_path, *args)
  assert ("the resumed epoch's train values (its logs and History) count "
          f"only its steps after {STOPPED_AT}: its checkpoint, saved by an "
          "older dist_keras, keeps none of the steps before") in out
  # Epoch 0's loss over steps 6-8 only: close to epoch 1's, EarlyStopping
  # stops after it (the whole run's epoch 0 loss is above 1).
  assert again.history["loss"][0] < 0.5
  assert again.summary["steps"] == 2 * EPOCH
