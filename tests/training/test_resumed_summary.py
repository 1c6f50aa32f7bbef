"""A preempted and resumed run's summary.json covers the whole run: its
counts summed and its rates combined over the processes that trained it,
and "resumed" says what covers what (segments.py); rates that a resume
changed start again, and a checkpoint that kept no totals is named."""
import contextlib
import io
import os
import re
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import user_task
from dist_keras import errors
from dist_keras.distribute import strategies
from dist_keras.training import run_record

ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")
STEPS, PREEMPTED_AT, OVERFLOWS = 16, 7, (1, 3)


def _config(**changes):
  """The tiny LSTM in float16 (loss scaling: skipped steps), timed at every
  log step (2) for the sync breakdown, one step per call, a checkpoint
  and an eval every 4 steps."""
  c = helpers.tiny_config()
  c.train.steps, c.train.log_every, c.train.steps_per_loop = STEPS, 2, 1
  c.train.precision = "float16"
  c.log.sync_timing, c.log.progress = True, True
  for key, value in changes.items():
    section, name = key.split(".")
    setattr(getattr(c, section), name, value)
  return c


def _fit(workdir, config, callbacks=()):
  return dist_keras.fit(config.model.name, config.data.name,
                        workdir=str(workdir), config=config,
                        strategy=ONE_CPU, callbacks=list(callbacks))


class _OverflowThenPreempt(keras.callbacks.Callback):
  """Steps OVERFLOWS overflow float16 (a loss scale no gradient survives,
  as in test_speed_options.py: skipped, as Keras' fit skips them); a
  SIGTERM after step PREEMPTED_AT, which checkpoints it and stops."""

  def __init__(self):
    super().__init__()
    self.step, self.scale = 0, None

  def on_train_batch_begin(self, batch, logs=None):
    scale = self.model.optimizer.dynamic_scale
    if self.step + 1 in OVERFLOWS:
      self.scale = float(scale.numpy())
      scale.assign(6e37)
    elif self.scale is not None:
      scale.assign(self.scale)  # (The overflow halved 6e37.)

  def on_train_batch_end(self, batch, logs=None):
    self.step += 1
    if self.step == PREEMPTED_AT:
      assert callable(signal.getsignal(signal.SIGTERM))  # The run's handler.
      signal.raise_signal(signal.SIGTERM)


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
  """(workdir, stdout) of a run preempted after step PREEMPTED_AT, its
  steps OVERFLOWS skipped; copy the workdir to resume it."""
  workdir = tmp_path_factory.mktemp("preempted")
  with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(
      errors.Preempted, match=f"after step {PREEMPTED_AT}"):
    _fit(workdir, _config(), [_OverflowThenPreempt()])
  return workdir, out.getvalue()


def _resumed(preempted, workdir, capsys, **changes):
  shutil.copytree(preempted[0], workdir)
  capsys.readouterr()
  result = _fit(workdir, _config(**changes))
  return result.summary, capsys.readouterr().out


def _values(tags, name, after=0):
  return [v for step, v in tags[name] if step > after]


def test_the_counts_and_rates_of_a_resumed_run_are_the_whole_runs(
    preempted, tmp_path, capsys):
  """skipped_steps and tracing_calls_s summed over both processes; the
  throughput and step times over every log window both counted (the
  TensorBoard perf/ points), the sync means over every breakdown both
  kept (the sync/ points); as summary.json says. The rerun's first call
  (step 8: it traced the step function, and its input skipped the steps
  trained) and its first window are left out of the rates, as a run's
  step 1 and first window are."""
  summary, out = _resumed(preempted, tmp_path / "run", capsys)
  assert summary["resumed"] == {"segments": 2, "resumed_at": [PREEMPTED_AT],
                                "counts_from_step": 0, "rates_from_step": 0}
  assert summary["skipped_steps"] == len(OVERFLOWS)
  tags = helpers.scalar_tags(str(tmp_path / "run"))
  # The rerun's TensorBoard counts on from the run's, as one run's does.
  assert tags["train/skipped_steps"][-1] == (STEPS, len(OVERFLOWS))
  # Every log window's but the first of each process (to 2, to 8: the
  # call that traced the step function runs in them) and the one the
  # preemption cut short (6 to 7).
  counted = {4: 2, 6: 2, 10: 2, 12: 2, 14: 2, 16: 2}
  assert [s for s, _ in tags["perf/step_ms"]] == list(counted)
  step_ms = _values(tags, "perf/step_ms")
  assert summary["step_ms_median"] == pytest.approx(np.median(step_ms),
                                                    rel=1e-6)
  assert summary["step_ms_p90"] == pytest.approx(
      np.percentile(step_ms, 90), rel=1e-6)
  seconds = sum(ms / 1e3 * counted[s] for s, ms in tags["perf/step_ms"])
  assert summary["examples_per_sec"] == pytest.approx(
      32 * sum(counted.values()) / seconds, rel=1e-6)
  assert [s for s, _ in tags["sync/step_ms"]] == [2, 4, 6, 10, 12, 14, 16]
  for name in ("step_ms", "compute_ms", "input_wait_ms", "allreduce_ms"):
    assert summary[name] == pytest.approx(
        np.mean(_values(tags, f"sync/{name}")), rel=1e-6), name
  assert re.search(r"step 8 in \d+\.\d s: traced and compiled the step "
                   r"function \(every step runs it\)", out)
  assert re.search(r"step  8/16 .*\(warm-up\)", out), out
  assert re.search(r"step 10/16 .* ex/s", out), out
  assert "over the run's 2 segments" in out
  # Each process traced its one step function and its eval pass.
  traced = [float(s) for s in re.findall(r" in (\d+\.\d) s: traced",
                                         preempted[1] + out)]
  assert len(traced) == 4, preempted[1] + out
  assert summary["tracing_calls_s"] == pytest.approx(sum(traced),
                                                     abs=0.051 * 6)
  # Killed after its last checkpoint: the rerun that finishes it writes
  # the same (from the checkpoint's record).
  for name in ("summary.json", "model.keras"):
    os.remove(tmp_path / "run" / name)
  finished = _fit(tmp_path / "run", _config()).summary
  assert finished["finished_by_rerun"]["checkpoint"] == f"ckpt-{STEPS}"
  for key, value in summary.items():
    if not key.startswith("eval_"):
      assert finished[key] == value, key


def test_a_resumed_run_starts_its_rates_again_when_the_step_changed(
    preempted, tmp_path, capsys):
  """Resumed with another batch size: the counts still cover the run, the
  rates the steps since the resume, in summary.json and in one line."""
  summary, out = _resumed(preempted, tmp_path / "run", capsys,
                          **{"train.global_batch_size": 16})
  assert summary["resumed"] == {
      "segments": 2, "resumed_at": [PREEMPTED_AT], "counts_from_step": 0,
      "rates_from_step": PREEMPTED_AT}
  assert summary["skipped_steps"] == len(OVERFLOWS)
  assert (f"summary.json's rates (throughput, step times, the sync "
          f"breakdown, MFU) cover the steps after {PREEMPTED_AT}: "
          "global_batch_size 32 -> 16 at this resume") in out
  tags = helpers.scalar_tags(str(tmp_path / "run"))
  step_ms = _values(tags, "perf/step_ms", after=PREEMPTED_AT)
  assert summary["step_ms_median"] == pytest.approx(np.median(step_ms),
                                                    rel=1e-6)
  assert summary["step_ms"] == pytest.approx(
      np.mean(_values(tags, "sync/step_ms", after=PREEMPTED_AT)), rel=1e-6)


class _Killed(Exception):
  """A process killed: nothing after it runs."""


class _KillAtEpoch(keras.callbacks.Callback):
  """A SIGKILL as epoch 1 begins: epoch 0's checkpoint saved, nothing
  after it."""

  def on_epoch_begin(self, epoch, logs=None):
    if epoch == 1:
      raise _Killed


def test_a_checkpoint_without_totals_says_what_the_summary_covers(
    tmp_path, monkeypatch, capsys):
  """Saved by a dist_keras that kept no totals: the counts and rates cover
  the steps since the resume, in summary.json and in one line."""
  snapshot = run_record.Keep._snapshot  # pylint: disable=protected-access

  def without_totals(self):
    record, arrays = snapshot(self)
    del record["totals"]
    return record, arrays

  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 8, "train.log_every": 2, "eval.every": 4,
            "train.checkpoint_every": 4, "log.calibration_steps": 0,
            "log.peak_tflops": 1.0}
  with monkeypatch.context() as patched, pytest.raises(_Killed):
    patched.setattr(run_record.Keep, "_snapshot", without_totals)
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path), config=config, strategy=ONE_CPU,
                   callbacks=[_KillAtEpoch()])
  capsys.readouterr()
  summary = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                           workdir=str(tmp_path), config=config,
                           strategy=ONE_CPU).summary
  assert summary["resumed"] == {"segments": 2, "resumed_at": [4],
                                "counts_from_step": 4, "rates_from_step": 4}
  assert ("summary.json's measurements cover the steps after 4 only: the "
          "checkpoint keeps none of the run's before it") in (
              capsys.readouterr().out)


def test_a_resume_on_other_replicas_or_pipelines_says_its_batches_differ(
    tmp_path, mirrored, capsys):
  """2 workers stopped and resumed as 1 process trained on, exit 0, 0.040
  off the uninterrupted run's weights, and only "config changed ...
  runtime.num_cpu_devices 2 -> 1" said so. The resume line now says the
  batches differ, and why; not for a resume on the same replicas and
  pipelines (exact), as pipeline_per_replica's resume of N one-replica
  workers on one process is."""
  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 8, "train.log_every": 2, "eval.every": 4,
            "train.checkpoint_every": 4, "log.calibration_steps": 0,
            "log.peak_tflops": 1.0}
  stopped = tmp_path / "stopped"
  with pytest.raises(_Killed):
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(stopped), config=config, strategy=mirrored,
                   callbacks=[_KillAtEpoch()])
  clause = ("resumed from ckpt-4 at step 4; on {}, where the run had 2 "
            "replica(s) fed by 1 input pipeline(s): the batches from here "
            "differ from an uninterrupted run's (each pipeline's shard of "
            "the data and per-replica batch change), so it is no longer an "
            "exact resume")
  for name, strategy, changes, now in [
      ("same", mirrored, {}, None),
      ("one_device", ONE_CPU, {},
       "1 replica(s) fed by 1 input pipeline(s)"),
      ("per_replica", mirrored, {"data.pipeline_per_replica": True},
       "2 replica(s) fed by 2 input pipeline(s)")]:
    shutil.copytree(stopped, tmp_path / name)
    capsys.readouterr()
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / name), config={**config, **changes},
                   strategy=strategy)
    resumed = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("resumed from")]
    assert resumed == [clause.format(now) if now else
                       "resumed from ckpt-4 at step 4"], (name, resumed)
  # 2 one-replica workers, one pipeline each, resumed by one process with
  # a pipeline per replica: the same batches (multi_worker.md).
  record = run_record.RunRecord()
  record.restored = ({"stream": {"input_pipelines": 2, "replicas": 2}}, {})
  assert run_record.other_batches(record, strategies.Role(
      mirrored, True, 1, pipelines=2)) is None


@pytest.mark.parametrize("jit,synced", [
    (False, [4, 8]),
    pytest.param(True, [8], marks=pytest.mark.slow)])  # XLA: ~60 s.
def test_a_resumed_runs_first_logged_step_has_its_sync_breakdown(
    tmp_path, jit, synced):
  """Resumed at step 2, the process warms its timed step function up with
  its first step (3), as a run does with step 1, so its first logged step
  (4) has a sync/ point: it had none (the call that traced the function
  is left out). The weights are the uninterrupted run's, bitwise. Under
  jit_compile on one device a timed step's update is not compiled and a
  plain step's is (a warm-up made them 3e-8 apart): no warm-up there."""
  config = _config(**{"train.steps": 8, "train.log_every": 4,
                      "eval.every": 2, "train.checkpoint_every": 2,
                      "train.jit_compile": jit})
  whole = _fit(tmp_path / "whole", config).model
  with pytest.raises(_Killed):
    _fit(tmp_path / "cut", config, [_KillAtEpoch()])  # Saved step 2.
  resumed = _fit(tmp_path / "cut", config)
  assert resumed.summary["resumed"]["resumed_at"] == [2]
  assert [s for s, _ in helpers.scalar_tags(str(tmp_path / "whole"))[
      "sync/step_ms"]] == [4, 8]
  assert [s for s, _ in helpers.scalar_tags(str(tmp_path / "cut"))[
      "sync/step_ms"]] == synced
  assert len(whole.weights) == len(resumed.model.weights)
  for expected, got in zip(whole.weights, resumed.model.weights):
    np.testing.assert_array_equal(got.numpy(), expected.numpy(),
                                  err_msg=expected.path)
