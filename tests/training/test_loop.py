"""The distributed loop on 2 logical CPU replicas, in process."""
import contextlib
import gc
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import types
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
from dist_keras import data, models, tensorboard_events, validate
from dist_keras.distribute import iterators, strategies
from dist_keras.training import allreduce, run_files

CONTRACT_TAGS = {"loss", "accuracy", "learning_rate", "perf/step_ms",
                 "perf/examples_per_sec", "perf/examples_per_sec_per_replica",
                 "eval/accuracy", "eval/loss"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, mirrored):
  """One run of the tiny LSTM config with progress lines, shared by the
  tests that only read what it wrote or start from a copy of its workdir:
  each run costs ~10 CPU-s, mostly tracing, and CI has 15 minutes.
  helpers.fit's result plus `stdout` (what it printed) and `validations`
  (how often the config, data and model settings were checked: the
  data's when its source opens)."""
  c = helpers.tiny_config()
  c.log.progress = c.log.sync_timing = True
  printed = io.StringIO()
  with pytest.MonkeyPatch.context() as patch:
    calls = _count_calls(patch, (validate, "config"), (data, "source"),
                         (models, "check"))
    with contextlib.redirect_stdout(printed):
      result = helpers.fit(c, tmp_path_factory.mktemp("tiny_run"), mirrored)
  return types.SimpleNamespace(**vars(result), stdout=printed.getvalue(),
                               validations=dict(calls))


def _copy_of(run, tmp_path):
  """A copy of `run`'s workdir: a test that trains on goes on from there."""
  workdir = tmp_path / "run"
  shutil.copytree(run.workdir, workdir)
  return workdir


# The CNN's run (~30 CPU-s) in the slow set: CI trains the CNN elsewhere
# (test_synthetic_data.py, test_equivalence.py) and the contract is the loop's.
@pytest.mark.parametrize("config_name", [
    "lstm_longmem", pytest.param("cnn_shapes", marks=pytest.mark.slow)])
def test_train_writes_the_workdir_contract(tmp_path, mirrored, config_name,
                                           request):
  if config_name == "lstm_longmem":
    result = request.getfixturevalue("tiny_run")
    workdir, summary = str(result.workdir), result.summary
  else:
    workdir = str(tmp_path)
    summary = helpers.train(helpers.tiny_config(config_name), workdir,
                            mirrored)
  for name in ("config.json", "summary.json", "model.keras", "checkpoints"):
    assert os.path.exists(os.path.join(workdir, name)), name
  on_disk = json.load(open(os.path.join(workdir, "summary.json")))
  assert on_disk == json.loads(json.dumps(summary))
  assert on_disk["strategy"] == "MirroredStrategy"
  assert on_disk["replicas"] == 2 and on_disk["steps"] == 8
  assert 0.0 <= on_disk["eval_accuracy"] <= 1.0
  assert on_disk["eval_examples"] == 128
  assert on_disk["examples_per_sec"] > 0
  config = json.load(open(os.path.join(workdir, "config.json")))
  assert config["train"]["steps"] == 8
  assert not [f for f in os.listdir(workdir) if "tmp" in f]


def test_summaries_carry_the_contract_tags(tiny_run):
  tags = helpers.scalar_tags(str(tiny_run.workdir))
  assert CONTRACT_TAGS <= set(tags), CONTRACT_TAGS - set(tags)
  assert [s for s, _ in tags["loss"]] == [4, 8]
  # The first interval includes tracing: perf/* leaves it out.
  assert [s for s, _ in tags["perf/step_ms"]] == [8]
  eps = dict(tags["perf/examples_per_sec"])[8]
  per_replica = dict(tags["perf/examples_per_sec_per_replica"])[8]
  assert per_replica == pytest.approx(eps / 2, rel=1e-5)
  assert dict(tags["learning_rate"])[8] == pytest.approx(3e-3)


def test_config_text_summary(tiny_run):
  texts = []
  for path in helpers.event_files(str(tiny_run.workdir)):
    for event in tf.compat.v1.train.summary_iterator(path):
      texts += [v.tensor.string_val[0].decode() for v in event.summary.value
                if v.tag == "config"]
  assert texts and '"global_batch_size": 32' in texts[0]


def _next_second() -> None:
  """Waits for the clock's next second. TensorBoard orders a folder's event
  files by name, events.out.tfevents.SECONDS.HOST.PID.N: two writers of one
  process in one second sort by N as text, so 10 came before 9 (the rerun's
  file read first: CI saw the killed run's points win). A rerun is another
  process, seconds later."""
  second = int(time.time())
  while int(time.time()) == second:
    time.sleep(0.01)


def test_points_a_resumed_run_logs_again_replace_the_killed_runs(tmp_path):
  """A run killed after its step-4 checkpoint had logged steps 5-6; its
  rerun logs them again. TensorBoard's loaders each show one point per
  step, the rerun's: its Python loader showed both (no SessionLog START),
  its Rust data server drops them by itself."""
  logdir = str(tmp_path)
  for resumed_at, steps, offset in ((0, range(1, 7), 0.0),
                                    (4, range(5, 9), 100.0)):
    _next_second()  # A file's name: its second, then a process counter.
    writer = tensorboard_events.Writer(logdir, enabled=True)
    writer.start(resumed_at)
    for step in steps:
      writer.scalars(step, {"loss": offset + step})
    writer.close()
  rerun = [(s, s + (100.0 if s > 4 else 0.0)) for s in range(1, 9)]
  assert helpers.scalar_tags(logdir) == {"loss": rerun}
  assert helpers.served_scalars(logdir) == {"loss": rerun}


def test_a_rerun_after_a_kill_leaves_one_point_per_step(tiny_run, tmp_path,
                                                        mirrored):
  """The tiny run as if killed after its step-4 checkpoint (it had logged
  step 8), rerun: both loaders show steps 4 and 8 once each."""
  workdir = _copy_of(tiny_run, tmp_path)
  helpers.as_if_killed_after(str(workdir), kept=4, last=8)
  assert helpers.train(helpers.tiny_config(), str(workdir),
                       mirrored)["steps"] == 8
  assert len(helpers.event_files(str(workdir))) == 2
  for loader in (helpers.scalar_tags, helpers.served_scalars):
    tags = loader(str(workdir))
    assert [s for s, _ in tags["loss"]] == [4, 8], loader
    assert [s for s, _ in tags["eval/loss"]] == [4, 8], loader
    repeated = {tag: steps for tag, steps in (
        (tag, [s for s, _ in points]) for tag, points in tags.items())
                if len(set(steps)) != len(steps)}
    assert not repeated, (loader, repeated)


def test_replica_variables_stay_identical(tiny_run, mirrored):
  model = tiny_run.model
  for variable in model.weights + model.optimizer.variables:
    copies = mirrored.experimental_local_results(variable.value)
    assert len(copies) == 2, variable.path
    np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy(),
                                  err_msg=variable.path)


def test_restart_resumes_from_latest_checkpoint(tiny_run, tmp_path, mirrored,
                                                capsys):
  workdir = _copy_of(tiny_run, tmp_path)
  c = helpers.tiny_config()
  c.log.progress = True
  c.train.steps = 12
  summary = helpers.train(c, str(workdir), mirrored)
  out = capsys.readouterr().out
  assert "at step 8" in out and "resumed" in out
  assert summary["steps"] == 12 and tiny_run.summary["steps"] == 8
  steps = sorted(int(p.split("-")[-1].split(".")[0]) for p in
                 tf.io.gfile.glob(os.path.join(workdir, "checkpoints",
                                               "ckpt-*.index")))
  assert steps[-1] == 12


def test_the_checkpoint_holds_the_loops_step_not_the_optimizers(tmp_path):
  """Steps are batches read, counted by the loop and checkpointed: with
  gradient accumulation the optimizer counts updates (8 steps: 2 of 3)."""
  import keras  # pylint: disable=g-import-not-at-top
  import user_task  # pylint: disable=g-import-not-at-top

  def accumulating():
    model = user_task.model_fn()
    model.compile(optimizer=keras.optimizers.SGD(
        0.05, gradient_accumulation_steps=3), loss="mse")
    return model

  c = {"train.steps": 8, "train.log_every": 4, "train.checkpoint_every": 4,
       "train.global_batch_size": user_task.GLOBAL_BATCH, "eval.every": 0,
       "log.progress": False, "log.calibration_steps": 0}
  result = helpers.fit_fns(accumulating, user_task.dataset_fn, tmp_path, c)
  assert result.summary["steps"] == 8
  assert int(result.model.optimizer.iterations.numpy()) == 2
  reader = tf.train.load_checkpoint(os.path.join(tmp_path, "checkpoints"))
  assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 8


def test_only_the_chief_writes(tmp_path, mirrored, monkeypatch):
  monkeypatch.setattr(strategies, "is_chief", lambda strategy: False)
  helpers.train(helpers.tiny_config(), str(tmp_path), mirrored)
  assert not helpers.event_files(str(tmp_path))
  for name in ("summary.json", "model.keras", "config.json"):
    assert not os.path.exists(os.path.join(tmp_path, name)), name


@pytest.mark.parametrize("jit,traced", [
    (False, ["step function (every step runs it)"]),
    (True, ["timed step function (logged steps run it)",
            "plain step function (the untimed steps run it)"])])
def test_timed_and_plain_steps_share_a_function_unless_compiled_apart(
    tmp_path, jit, traced):
  """One device: a timed call is the plain steps' function run for one
  step, one trace and compile (a second cost a 48-block MLP 19 s of a 50 s
  run), unless jit_compile compiles a plain step's update too, which a
  timed one cannot (tf.timestamp has no XLA kernel)."""
  c = helpers.tiny_config()
  c.log.progress, c.log.sync_timing, c.train.jit_compile = True, True, jit
  c.train.steps, c.train.log_every, c.eval.every = 8, 4, 0
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    helpers.train(c, tmp_path, tf.distribute.OneDeviceStrategy("/cpu:0"))
  lines = [l.split("traced and compiled the ")[1]
           for l in printed.getvalue().splitlines()
           if l.startswith("step") and "traced and compiled the " in l]
  assert lines == traced
  tags = helpers.scalar_tags(str(tmp_path))
  assert [s for s, _ in tags["sync/step_ms"]] == [4, 8]


def test_progress_lines_show_step_loss_throughput_and_eta(tiny_run):
  # Validated once: the config, the built-in data's and model's settings.
  assert tiny_run.validations == {"config": 1, "source": 1, "check": 1}
  lines = tiny_run.stdout.splitlines()
  # The first call traces the one step function the timed and the plain
  # calls run (a second function was a second trace and compile).
  traced = [l for l in lines
            if l.startswith("step") and "traced and compiled" in l]
  assert [l.split(": ")[0].split(" in ")[0] for l in traced] == ["step 1"]
  assert traced[0].endswith("the step function (every step runs it)")
  step_lines = [l for l in lines if l.startswith("step") and l not in traced]
  assert len(step_lines) == 2
  assert "warm-up" in step_lines[0]
  assert all(k in step_lines[1] for k in ("8/8", "loss", "ex/s", "ETA"))
  # Each eval says its time; the first, which traced the eval pass, says so
  # (a large model's can take minutes), and counts as start-up.
  evals = [l for l in lines if l.startswith("eval at step")]
  assert [l.split(":")[0] for l in evals] == ["eval at step 4",
                                              "eval at step 8"]
  assert evals[0].endswith(
      " s: traced and compiled the eval pass)"), evals[0]
  assert evals[1].endswith(" s)") and "(128 examples in " in evals[1]
  first_eval = float(evals[0].split(" examples in ")[1].split(" s")[0])
  step_traces = sum(float(l.split(" in ")[1].split(" s")[0]) for l in traced)
  assert tiny_run.summary["tracing_calls_s"] == pytest.approx(
      step_traces + first_eval, abs=0.2)  # Each printed to 0.1 s.


def _count_calls(monkeypatch, *targets) -> dict:
  """Wraps each (module, function name) to count its calls."""
  calls = {}
  for module, name in targets:
    original = getattr(module, name)
    calls[name] = 0

    def counted(*args, _name=name, _original=original, **kwargs):
      calls[_name] += 1
      return _original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
  return calls


@pytest.mark.parametrize("name", ["sgd", "rmsprop"])
def test_momentum_reaches_the_optimizer(name):
  c = helpers.tiny_config()
  c.train.optimizer, c.train.momentum = name, 0.9
  assert models.make_optimizer(c.train).momentum == pytest.approx(0.9)


def test_workdir_that_cannot_be_written_is_refused(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="is not writable"):
    run_files.prepare(str(blocker / "run"))


def test_checkpoint_of_another_model_is_refused_not_overwritten(
    tiny_run, tmp_path, mirrored):
  workdir = _copy_of(tiny_run, tmp_path)
  before = sorted(os.listdir(workdir / "checkpoints"))
  config_json = (workdir / "config.json").read_text()
  events = helpers.event_files(str(workdir))
  other = helpers.tiny_config()
  other.model.cell = "simple_rnn"
  warned = []
  handler = logging.Handler()
  handler.emit = lambda record: warned.append(record.getMessage())
  logging.getLogger("tensorflow").addHandler(handler)
  try:
    with pytest.raises(ValueError, match="holds a checkpoint .* made by a "
                       "different model"):
      helpers.train(other, str(workdir), mirrored)
    gc.collect()  # (A notebook's next cell.)
  finally:
    logging.getLogger("tensorflow").removeHandler(handler)
  # Its one line only: not TensorFlow's about the abandoned restore too.
  assert not [w for w in warned if "unrestored values" in w], warned
  assert sorted(os.listdir(workdir / "checkpoints")) == before
  assert (workdir / "config.json").read_text() == config_json
  assert helpers.event_files(str(workdir)) == events
  assert _lock_is_free(workdir)  # Let go of, though refused.


def _lock_is_free(workdir) -> bool:
  """Whether another process can take `workdir`'s lock now."""
  return subprocess.run(
      [sys.executable, "-c", "import fcntl, sys\n"
       "f = open(sys.argv[1], 'a')\n"
       "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
       str(workdir / ".lock")], check=False).returncode == 0


@contextlib.contextmanager
def _held_by_another_run(workdir):
  """`workdir` locked by another process (pid 12345 in its lock file), as
  a run training there holds it."""
  holder = subprocess.Popen(
      [sys.executable, "-c", (
          "import fcntl, sys, time\n"
          f"f = open({str(workdir / '.lock')!r}, 'a+')\n"
          "fcntl.flock(f, fcntl.LOCK_EX)\n"
          "f.truncate(0); f.write('12345'); f.flush()\n"
          "print('held', flush=True)\n"
          "time.sleep(120)")], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    yield
  finally:
    holder.kill()
    holder.wait()


def test_a_workdir_in_use_is_refused_before_anything_reads_it(
    tiny_run, tmp_path, mirrored):
  """The lock comes first: a checkpoint the other run is writing was read
  as another model's (or as damaged), and an unreadable TensorFlow list of
  them rewritten, before the second run was told the workdir is in use."""
  workdir = _copy_of(tiny_run, tmp_path)
  listing = workdir / "checkpoints" / "checkpoint"
  listing.write_text("half written")
  other = helpers.tiny_config()
  other.model.cell = "simple_rnn"  # What the other run's files look like.
  with _held_by_another_run(workdir), pytest.raises(
      ValueError, match=r"^workdir='\S+' is in use by another run \(process "
      r"12345\); wait for it to end, or pass another workdir.$"):
    helpers.train(other, str(workdir), mirrored)
  assert listing.read_text() == "half written"


def test_a_finished_workdirs_rerun_lets_go_of_it(tiny_run, tmp_path,
                                                  mirrored):
  """...and writes nothing there: no events file either (each rerun
  added one of 78 bytes, which TensorBoard reads as nothing)."""
  workdir = _copy_of(tiny_run, tmp_path)
  before = sorted(helpers.event_files(str(workdir)))
  helpers.train(helpers.tiny_config(), str(workdir), mirrored)
  assert _lock_is_free(workdir)
  assert sorted(helpers.event_files(str(workdir))) == before


class _FailsAtStep1(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    raise RuntimeError("fails at the run's first step")


def test_a_run_that_fails_at_its_first_step_leaves_no_events_file(
    tiny_run, tmp_path, mirrored):
  """Neither a new run in a folder that was there (the folder is kept: it
  was not the run's) nor a resumed one leaves an events file of the
  config text and the layout alone (a run with nothing in TensorBoard's
  list; a resumed one's config at a step it never trained)."""
  resumed = _copy_of(tiny_run, tmp_path)
  new = tmp_path / "there_before"
  new.mkdir()
  before = sorted(helpers.event_files(str(resumed)))
  c = helpers.tiny_config()
  c.train.steps = 12
  for workdir in (new, resumed):
    with pytest.raises(RuntimeError, match="first step"):
      dist_keras.fit(c.model.name, c.data.name, workdir=str(workdir),
                     config=c, strategy=mirrored,
                     callbacks=[_FailsAtStep1()])
  assert not helpers.event_files(str(new))
  assert sorted(helpers.event_files(str(resumed))) == before


def test_a_workdir_past_train_steps_says_so_and_writes_its_results(
    tiny_run, tmp_path, mirrored, capsys):
  """A run stopped at ckpt-8 (its results not written), rerun with
  train.steps=4: as for a finished workdir, the line says train.steps is
  below the step it is at (it said nothing, and wrote `done: 8 steps`)."""
  workdir = _copy_of(tiny_run, tmp_path)
  for name in (run_files.SUMMARY_JSON, run_files.MODEL_FILE):
    os.remove(workdir / name)
  c = helpers.tiny_config()
  c.train.steps, c.log.progress = 4, True
  summary = helpers.train(c, str(workdir), mirrored)
  out = capsys.readouterr().out
  assert ("this workdir is at step 8 (train.steps=4 is below it): nothing "
          "is trained; its results are written for step 8 (pass a new "
          "workdir to train 4 steps)") in out
  assert summary["steps"] == 8 and "\ndone: 8 steps," in out
  assert (workdir / run_files.MODEL_FILE).exists()


SYNC_TAGS = ["sync/input_wait_ms", "sync/compute_ms", "sync/allreduce_ms",
             "sync/straggler_ms", "sync/fraction", "sync/step_ms"]


def test_logged_steps_carry_the_sync_breakdown(tiny_run):
  summary = tiny_run.summary
  tags = helpers.scalar_tags(str(tiny_run.workdir))
  for tag in SYNC_TAGS:
    # Step 4 is the first logged step after warm-up (step 1 is discarded).
    assert [s for s, _ in tags[tag]] == [4, 8], tag
  for step in (4, 8):
    value = {t: dict(tags[t])[step] for t in SYNC_TAGS}
    parts = sum(value[t] for t in SYNC_TAGS[:4])
    worst = sum(dict(tags[t.replace("_ms", "_max_ms")])[step]
                for t in SYNC_TAGS[:4])
    # Each replica's four parts add up to its own step; the logged step ends
    # with the last replica's. So the means add up to no more than the step
    # and the per-part maxima to no less, however far apart the replicas end
    # on a busy host (exact at one replica: tests/measure/test_sync_scaling.py).
    assert parts <= value["sync/step_ms"] * (1 + 1e-5)
    assert worst >= value["sync/step_ms"] * (1 - 1e-5)
    assert value["sync/fraction"] == pytest.approx(
        (value["sync/allreduce_ms"] + value["sync/straggler_ms"])
        / value["sync/step_ms"], rel=1e-5)
  assert {"sync_replica/0/compute_ms", "sync_replica/1/compute_ms"} <= set(
      tags)
  assert dict(tags["sync/gradient_bytes"])[4] == summary["gradient_bytes"]
  # Nothing gathered (the next test): no tag for it.
  assert summary["gathered_bytes"] == 0 and "sync/gathered_bytes" not in tags
  assert 0 < summary["sync_fraction"] < 1
  assert summary["compute_ms"] > 0


def test_the_sent_bytes_are_the_gradients_as_sent(tiny_run):
  """Under the default global_clipnorm the Embedding's table (16 tokens x
  8) is all-reduced dense, with the float32 sum of its slices' squares
  (training/sparse_grads.py); nothing is gathered."""
  model = tiny_run.model
  dense = allreduce.gradient_bytes(model.trainable_variables)
  assert tiny_run.summary["gradient_bytes"] == dense + 4
  assert tiny_run.summary["gathered_bytes"] == 0


@pytest.fixture(scope="module")
def untimed_run(tmp_path_factory, mirrored):
  """The tiny run with log.sync_timing off (tiny_config's) and no clip:
  the sent bytes' and the host times' tests read the same run."""
  c = helpers.tiny_config()
  c.train.global_clipnorm = 0.0
  return helpers.fit(c, tmp_path_factory.mktemp("untimed"), mirrored)


def test_the_sent_bytes_are_counted_without_timed_steps(untimed_run):
  """With log.sync_timing off (no timed step) the plain steps count them:
  the summary had the Embedding's dense table as all-reduced bytes. No
  clip: Adam sees the slices, so a replica gathers its batch's, 16
  sequences x 12 tokens of 8 float32s, and their int32 indices."""
  result = untimed_run
  dense = allreduce.gradient_bytes(result.model.trainable_variables)
  assert result.summary["gradient_bytes"] == dense - 16 * 8 * 4
  assert result.summary["gathered_bytes"] == 16 * 12 * (8 * 4 + 4)


def test_a_large_vocabularys_slices_are_sent_not_its_table(tmp_path,
                                                           mirrored):
  """Under the default global_clipnorm, a 50,000-token table of 8 float32s
  (1.6 MB) would send far more than a replica's slices, 16 sequences x 12
  tokens of 8 float32s and their int32 indices (7 KB): the slices are
  gathered, the table is not all-reduced (training/sparse_grads.py), and
  the summary says so."""
  c = helpers.tiny_config()
  c.data.vocab_size = 50_000
  c.train.steps, c.eval.every, c.train.checkpoint_every = 4, 0, 4
  result = helpers.fit(c, tmp_path, mirrored)
  dense = allreduce.gradient_bytes(result.model.trainable_variables)
  assert result.summary["gradient_bytes"] == dense - 50_000 * 8 * 4
  assert result.summary["gathered_bytes"] == 16 * 12 * (8 * 4 + 4)


def test_sync_timing_off_writes_only_the_host_times(untimed_run):
  """No timed step, no split; the host's clocks (test_step_meters.py).
  (Its slices gathered: a timed window's sync/gathered_bytes is not
  written either.)"""
  summary, workdir = untimed_run.summary, str(untimed_run.workdir)
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["log"]["sync_timing"] is False
  assert summary["gathered_bytes"] > 0
  assert sorted(t for t in helpers.scalar_tags(workdir)
                if t.startswith("sync")) == ["sync/callbacks_ms",
                                             "sync/outside_ms"]
  assert summary["sync_fraction"] is None and summary["sync_split"] is None


def test_calibration_adds_the_ideal_step_and_the_allreduce_model(
    tmp_path, mirrored, capsys):
  c = helpers.tiny_config()
  c.log.calibration_steps, c.log.progress = 3, True
  c.log.sync_timing = True  # What calibration completes.
  summary = helpers.train(c, str(tmp_path), mirrored)
  assert summary["ideal_step_ms"] > 0
  assert summary["ideal_speedup"] == pytest.approx(
      summary["call_step_ms"] / summary["ideal_step_ms"])
  out = capsys.readouterr().out
  assert "with free communication" in out
  if summary["allreduce_predicted_ms"] is None:
    # A loaded host's sweep that fits no line (CI beside other work saw
    # one): said, and the run finished.
    assert summary["allreduce_fit_error"]
    return
  assert summary["allreduce_predicted_ms"] > 0
  assert summary["allreduce_bandwidth_GBps"] > 0
  assert "alpha-beta model" in out


def test_calibration_compares_calls_not_what_runs_between_them(
    tmp_path, capsys):
  """A callback's seconds are not communication: a callback sleeping 0.2 s
  a step made one device's tiny step read "ideal speedup x14.70" (the step
  from throughput, callbacks included)."""
  class Sleepy(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      time.sleep(0.2)

  c = helpers.tiny_config()
  c.train.steps = 12
  c.log.calibration_steps, c.log.progress = 3, True
  summary = dist_keras.fit(c.model.name, c.data.name, workdir=str(tmp_path),
                           config=c, strategy="one_device",
                           callbacks=[Sleepy()]).summary
  assert 1e3 / summary["examples_per_sec"] * 32 > 200  # Sleeps counted here.
  # The step is its calls' (the 200 ms sleeps would dwarf 100 ms); the
  # speedup is that over the step without communication (on a loaded
  # host a tiny step's call overhead alone read x7: no bound on it here).
  assert summary["call_step_ms"] < 100
  assert summary["ideal_speedup"] == pytest.approx(
      summary["call_step_ms"] / summary["ideal_step_ms"])
  assert ("ms in its calls; without the update (one replica: nothing to "
          "all-reduce)") in capsys.readouterr().out


def test_a_failed_allreduce_fit_does_not_cost_the_run(tmp_path, mirrored,
                                                     monkeypatch, capsys):
  from dist_keras.measure import costmodel  # pylint: disable=g-import-not-at-top

  def refuse(*args, **kwargs):
    raise ValueError("all-reduce time does not grow with message size")

  # Refused at once (the sweep before the fit is test_costmodel's).
  monkeypatch.setattr(costmodel, "calibrate", refuse)
  c = helpers.tiny_config()
  c.log.calibration_steps, c.log.progress = 2, True
  summary = helpers.train(c, str(tmp_path), mirrored)
  assert summary["allreduce_predicted_ms"] is None
  assert "does not grow" in summary["allreduce_fit_error"]
  assert summary["ideal_step_ms"] > 0
  assert (tmp_path / "summary.json").exists()
  assert "all-reduce model not fitted" in capsys.readouterr().out


def test_profile_steps_write_a_trace_of_marked_steps(tmp_path, mirrored):
  from dist_keras.measure import trace  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.steps, c.log.profile_steps = 8, "3,5"
  helpers.train(c, str(tmp_path), mirrored)
  (path,) = trace.find_traces(str(tmp_path))
  result = trace.collective_ms_per_step(path)
  assert result["step_nums"] == [3, 4, 5]
  assert result["executions"] >= 3 * 2


def test_profile_window_at_the_last_steps_is_still_written(tmp_path, mirrored):
  from dist_keras.measure import trace  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.steps, c.log.profile_steps = 8, "7,8"
  helpers.train(c, str(tmp_path), mirrored)
  (path,) = trace.find_traces(str(tmp_path))
  assert trace.collective_ms_per_step(path)["executions"] >= 2


def test_non_finite_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(
    tmp_path, mirrored):
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.optimizer, c.train.learning_rate = "sgd", 1e38
  c.train.global_clipnorm = 0.0
  c.train.checkpoint_every, c.eval.every = 1, 0
  with pytest.raises(errors.Diverged) as e:
    helpers.train(c, str(tmp_path), mirrored)
  message = str(e.value)
  bad_step = int(message.split(" at step ")[1].split(":")[0])
  assert "training diverged" in message and "\n" not in message
  saved = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
  if bad_step > 1:
    # Every step before the bad one was checkpointed; the bad one never is.
    assert saved.endswith(f"ckpt-{bad_step - 1}")
    assert f"ckpt-{bad_step - 1}" in message
    reader = tf.train.load_checkpoint(saved)
    for name in reader.get_variable_to_shape_map():
      value = reader.get_tensor(name)
      if np.issubdtype(np.asarray(value).dtype, np.floating):
        assert np.all(np.isfinite(value)), name
  else:
    assert saved is None and "no checkpoint was saved" in message
  assert not (tmp_path / "summary.json").exists()


def test_steps_per_loop_trains_the_same_steps_and_logs_at_the_same_points(
    tmp_path, mirrored, monkeypatch):
  """1, 7 and automatic (0) steps a call train the same weights and log,
  evaluate and checkpoint at the same steps. Automatic: every window after
  the first measured a step long enough for 4 a call (the sizing itself:
  tests/training/test_settings.py), so its calls are known. (20 steps:
  each run's calls are cut short both at a checkpoint and eval and before
  a timed step.)"""
  from dist_keras.training import actions  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(actions, "auto_steps_per_call",
                      lambda seconds, multi_worker: 4 if seconds else 1)
  runs, calls = {}, {}
  for spl in (1, 7, 0):
    c = helpers.tiny_config()
    c.log.sync_timing = True  # Timed steps run alone: calls stop before them.
    c.train.steps, c.train.log_every, c.train.checkpoint_every = 20, 10, 13
    c.eval.every, c.train.steps_per_loop = 13, spl
    with helpers.trainer(c, str(tmp_path / str(spl)), mirrored) as trainer:
      calls[spl] = _call_sizes(monkeypatch, trainer)
      summary = trainer.run()
    runs[spl] = summary, [w.numpy() for w in trainer.model.weights]
  # Automatic: steps 1-10 one a call (1 and 10 are timed; no window
  # measured before 10); then 11-13 (the checkpoint and eval after it),
  # 14-17, 18-19 (before the timed step) and the timed 20.
  assert calls[0] == [1] * 10 + [3, 4, 2, 1]
  # What the automatic run chose, which config.json (steps_per_loop 0)
  # cannot say.
  assert runs[0][0]["chosen"] == {"steps_per_call": "auto", "largest_call": 4,
                                  "xla": "off", "per_replica_batch": 16}
  assert max(calls[7]) == 7 and calls[1] == [1] * 20
  tags = {spl: helpers.scalar_tags(str(tmp_path / str(spl))) for spl in runs}
  (one, w1) = runs[1]
  for spl in (7, 0):
    many, weights = runs[spl]
    assert one["steps"] == many["steps"] == sum(calls[spl]) == 20
    for a, b in zip(w1, weights):
      np.testing.assert_array_equal(a, b)
    for tag in ("loss", "eval/accuracy", "sync/allreduce_ms"):
      assert [s for s, _ in tags[1][tag]] == [s for s, _ in tags[spl][tag]]
    np.testing.assert_allclose([v for _, v in tags[1]["loss"]],
                               [v for _, v in tags[spl]["loss"]], rtol=1e-6)
    assert sorted(os.listdir(tmp_path / str(spl) / "checkpoints")) == sorted(
        os.listdir(tmp_path / "1" / "checkpoints"))


def _call_sizes(monkeypatch, trainer):
  """Records the steps of every call of the trainer's step functions."""
  calls = []
  functions = trainer._step_functions  # pylint: disable=protected-access

  def recorded():
    call = functions()

    def recording(iterator, timed, n):
      calls.append(1 if timed else n)
      return call(iterator, timed, n)

    # (The loop asks these too.)
    recording.first_timed = call.first_timed
    recording.trainable_changed = call.trainable_changed
    return recording

  monkeypatch.setattr(trainer, "_step_functions", recorded)
  return calls


def test_a_train_stream_that_runs_dry_names_the_step_inside_a_call(
    tmp_path):
  import user_task  # pylint: disable=g-import-not-at-top

  from dist_keras.errors import UserError  # pylint: disable=g-import-not-at-top

  def five_batches(split, ctx: tf.distribute.InputContext):
    ds = user_task.dataset_fn(split, ctx)
    # The filter hides the length from the check that refuses a finite
    # stream before training: this one runs dry mid-call.
    return ds.take(5).filter(lambda *example: True) if split == "train" else ds

  c = {"train.steps": 20, "train.log_every": 20, "train.steps_per_loop": 4,
       "train.global_batch_size": user_task.GLOBAL_BATCH,
       "log.progress": False, "log.calibration_steps": 0}
  # Steps 2-5 run in one call, 6-9 in the next, which fails at step 6.
  with pytest.raises(UserError, match=r"ran out of batches at steps 6-9;"):
    dist_keras.fit(user_task.model_fn, five_batches, workdir=str(tmp_path),
            config=c, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))


@pytest.mark.parametrize("sync_timing", [False, True])
def test_steps_per_loop_stops_at_the_first_non_finite_step(tmp_path,
                                                           mirrored,
                                                           sync_timing):
  """With or without timing: the plain steps run unstamped, or stamped in
  the timed steps' function."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.optimizer, c.train.learning_rate = "sgd", 1e38
  c.train.global_clipnorm, c.train.steps_per_loop = 0.0, 8
  c.train.steps, c.train.log_every, c.train.checkpoint_every = 40, 20, 20
  c.log.sync_timing, c.eval.every = sync_timing, 0
  with pytest.raises(errors.Diverged, match=r"at step 3:"):
    helpers.train(c, str(tmp_path), mirrored)


def test_bfloat16_computes_in_bfloat16_keeps_float32_variables(tmp_path,
                                                                mirrored):
  import keras  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.precision = "bfloat16"
  with helpers.trainer(c, str(tmp_path), mirrored) as trainer:
    summary = trainer.run()
  assert np.isfinite(summary["train_loss"]) and summary["steps"] == 8
  dense = trainer.model.layers[-1]
  assert dense.compute_dtype == "bfloat16"
  assert all(v.dtype == "float32" for v in trainer.model.weights)
  # The policy did not leak into the rest of the process.
  assert keras.config.dtype_policy().name == "float32"


def _poisoned(bad_steps):
  """user_task's model and data, with an input that turns the loss NaN in
  the batches of `bad_steps` (steps count from 1)."""
  import keras  # pylint: disable=g-import-not-at-top
  import user_task  # pylint: disable=g-import-not-at-top

  class Poison(keras.layers.Layer):
    def call(self, x):
      bad = tf.reduce_any(tf.equal(x[:, 0], 99.0))
      return tf.where(bad, x * np.nan, x)

  def model_fn():
    inputs = keras.Input((user_task.FEATURES,))
    hidden = keras.layers.Dense(16, activation="tanh")(Poison()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model

  def dataset_fn(split, ctx):
    ds = user_task.dataset_fn(split, ctx)
    if split != "train":
      return ds

    def poison(i, batch):
      x, y, w = batch
      bad = tf.reduce_any(tf.equal(i + 1, bad_steps))
      return tf.where(bad, tf.tensor_scatter_nd_update(x, [[0, 0]], [99.0]),
                      x), y, w

    return ds.enumerate().map(poison)

  return model_fn, dataset_fn


def test_divergence_retries_go_back_and_skip_the_batches_that_diverged(
    tmp_path, capsys):
  """The step-10 batch turns the loss NaN: back to ckpt-8, on with batch 11
  (the steps still count batches read); a second bad batch with one retry
  is divergence, exit 3."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  config = {"train.steps": 20, "train.log_every": 5,
            "train.checkpoint_every": 4, "train.global_batch_size": 48,
            "train.divergence_retries": 1, "eval.every": 0,
            "log.calibration_steps": 0, "log.peak_tflops": 1.0}
  result = helpers.fit_fns(*_poisoned([10]), tmp_path / "once", config)
  assert "at step 10: back to ckpt-8, skipping batches 9-10 (0 retries " \
      "left)" in capsys.readouterr().out
  assert result.summary["steps"] == 20
  assert result.summary["skipped_after_divergence"] == [[9, 10]]
  assert all(np.isfinite(w).all() for w in result.model.get_weights())
  with pytest.raises(errors.Diverged, match="at step 15"):
    helpers.fit_fns(*_poisoned([10, 15]), tmp_path / "twice", config)
  # The budget is the run's: a resumed process does not get a fresh one
  # (it went back to ckpt-12 and trained on).
  helpers.fit_fns(*_poisoned([10]), tmp_path / "resumed",
                  dict(config, **{"train.steps": 12}))
  with pytest.raises(errors.Diverged, match="at step 15"):
    helpers.fit_fns(*_poisoned([10, 15]), tmp_path / "resumed", config)


def test_going_back_after_a_divergence_goes_back_to_the_checkpoints_metrics(
    tmp_path):
  """The step-10 batch turns the loss NaN: back to ckpt-8's weights and
  its metrics. The epoch's loss counts steps 1-8 and 11-20 (those the
  weights went on from): the windows to 2, 4, 6, 8 and 12, ..., 20 (the
  window to 10 emptied: step 9 forgotten with the weights it made)."""
  config = {"train.steps": 20, "train.log_every": 2,
            "train.checkpoint_every": 4, "train.global_batch_size": 48,
            "train.divergence_retries": 1, "eval.every": 0,
            "log.calibration_steps": 0, "log.peak_tflops": 1.0}
  result = helpers.fit_fns(*_poisoned([10]), tmp_path, config)
  assert result.summary["skipped_after_divergence"] == [[9, 10]]
  windows = helpers.scalar_tags(str(tmp_path))["loss"]
  assert [step for step, _ in windows] == [2, 4, 6, 8, 12, 14, 16, 18, 20]
  # Every window is 2 steps of 48 examples: each weighs the same.
  assert result.history["loss"] == [pytest.approx(
      np.mean([loss for _, loss in windows]), rel=1e-6)]
  # A log line every step: the step that diverged leaves its window empty
  # (it raised ZeroDivisionError reading the window's time per step).
  result = helpers.fit_fns(*_poisoned([10]), tmp_path / "every",
                           dict(config, **{"train.log_every": 1}))
  windows = helpers.scalar_tags(str(tmp_path / "every"))["loss"]
  assert [step for step, _ in windows] == [*range(1, 10), *range(11, 21)]


def test_only_the_command_line_keeps_the_train_iterator_to_its_exit(
    tmp_path, mirrored, monkeypatch):
  """Destroying an autotuned iterator waits until tf.data's autotune thread
  next wakes (TF 2.21: 19 s after every other default run). The command
  line keeps it (iterators.keep_until_exit) and ends with os._exit; from
  Python the run hands it to the dropping thread, which destroys it once
  run() has let go (tests/distribute/test_iterators.py: off the caller's
  thread)."""
  c = helpers.tiny_config()
  c.train.steps = c.eval.every = 2
  held, hold = [], iterators.hold
  monkeypatch.setattr(iterators, "hold", lambda iterator: (
      held.append(weakref.ref(iterator)), hold(iterator)))
  for keeping in (False, True):
    monkeypatch.setattr(iterators, "_KEPT", None)
    if keeping:
      iterators.keep_until_exit()
    with helpers.trainer(c, str(tmp_path / str(keeping)), mirrored) as trainer:
      trainer.run()
  kept = iterators._KEPT  # pylint: disable=protected-access
  assert kept == [held[1]()]
  assert isinstance(kept[0], tf.distribute.DistributedIterator)
  monkeypatch.setattr(iterators, "_KEPT", None)
  hold(kept.pop())  # Not destroyed here: the dropping thread's too.
  deadline = time.monotonic() + 120  # The autotune thread's sleep, at most.
  while any(ref() is not None for ref in held) and (
      time.monotonic() < deadline):
    time.sleep(0.1)
  assert [ref() for ref in held] == [None, None]


def test_a_process_running_many_runs_is_not_warned_of_retracing(caplog):
  """Each run makes its eval pass, traced once; TensorFlow counts traces by
  the code's object, so a sweep's 5th run was warned "5 out of the last 9
  calls to make_eval_pass.<locals>.eval_pass triggered tf.function
  retracing"."""
  import logging  # pylint: disable=g-import-not-at-top
  from dist_keras.training import evaluation  # pylint: disable=g-import-not-at-top
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  dataset = tf.data.Dataset.from_tensors(
      (tf.zeros([4, 3]), tf.zeros([4, 1]))).repeat(2)
  logger = logging.getLogger("tensorflow")
  logger.addHandler(caplog.handler)
  try:
    for _ in range(7):
      evaluation.make_eval_pass(tf.distribute.get_strategy(), model)(dataset)
  finally:
    logger.removeHandler(caplog.handler)
  assert "retracing" not in caplog.text
