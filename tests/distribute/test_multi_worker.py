"""Multi-worker training: N processes on loopback (and across two network
namespaces) train the same weights as one process, and only the chief writes.

Workers start through tools/launch_local.py, as users start them.
"""
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers
import train_weights

LAUNCHER = os.path.join(helpers.REPO, "tools", "launch_local.py")
TRAIN_WEIGHTS = os.path.join(helpers.REPO, "tests", "scripts",
                             "train_weights.py")
GLOBAL_BATCH = 48  # Divisible by 2 and 3 workers.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _launch(num_workers, command, timeout=600, **env):
  return subprocess.run(
      [sys.executable, LAUNCHER, f"--num_workers={num_workers}", "--",
       sys.executable, *command], capture_output=True, text=True,
      timeout=timeout, env=dict(ENV, PYTHONPATH=helpers.REPO, **env),
      check=False)


# The built-in models; users' models across workers, against one device:
# tests/training/test_fit_parity.py.
MODELS = ("lstm_longmem", "cnn_shapes")


def _weights_command(strategy, devices, out, *extra):
  return [TRAIN_WEIGHTS, f"--strategy={strategy}", f"--devices={devices}",
          f"--global_batch_size={GLOBAL_BATCH}", f"--out={out}",
          f"--models={','.join(MODELS)}", *extra]


@pytest.fixture(scope="module")
def weights(tmp_path_factory, mirrored):
  """`(n) -> {kind: [weights per process]}` for n replicas, made on first use.

  The reference is ONE process, MirroredStrategy over N logical CPUs with one
  input pipeline per replica: it reads exactly the global batches N
  one-replica workers read (each worker is one input pipeline). For 2 it
  is this process (its 2 logical CPUs: a TensorFlow process less), while
  the workers run; for 3 a process of its own, alongside them.
  """
  out = tmp_path_factory.mktemp("mw")
  made = functools.cache(lambda n: _once(out, n, mirrored))

  def weights_of(n):
    result, failed = made(n)
    if failed:
      raise failed
    return result
  return weights_of


def _once(out, n, mirrored):
  """(_train_both's result, None), or (None, its exception), which every
  later test of `n` re-raises: functools.cache keeps no exception, and
  each test would start the cluster again (a 900 s timeout each).
  pytest-timeout's own failure (pytest.fail's, no Exception) is kept too."""
  try:
    return _train_both(out, n, mirrored), None
  except (Exception, pytest.fail.Exception) as e:  # pylint: disable=W0718
    return None, e


def _train_both(out, n, mirrored):
  procs = {"workers": subprocess.Popen(
      [sys.executable, LAUNCHER, f"--num_workers={n}", "--",
       sys.executable, *_weights_command(
           "multi_worker_mirrored", n, out / f"workers{n}_{{task}}.npz",
           f"--eval_ids_out={out}/ids{n}_{{task}}.npy")],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)}
  result = {}
  try:
    if n == mirrored.num_replicas_in_sync:
      result["one_process"] = [train_weights.models_after_training(
          MODELS, mirrored, GLOBAL_BATCH, pipeline_per_replica=True)]
    else:
      procs["one_process"] = subprocess.Popen(
          [sys.executable, *_weights_command(
              "mirrored", n, out / f"one_process{n}_0.npz",
              "--pipeline_per_replica")],
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
          env=ENV)
    for kind, proc in procs.items():
      log, _ = proc.communicate(timeout=900)
      assert proc.returncode == 0, f"{kind} {n} failed:\n{log[-3000:]}"
      files = n if kind == "workers" else 1
      result[kind] = [dict(np.load(out / f"{kind}{n}_{i}.npz"))
                      for i in range(files)]
  finally:  # A failed or timed-out set-up leaves no process training on
    helpers.stop(procs.values())  # (SIGTERM: the launcher stops its workers).
  result["eval_ids"] = [np.load(out / f"ids{n}_{i}.npy") for i in range(n)]
  return result


# Three workers (an odd count) in the slow set: CI runs two.
WORKER_COUNTS = [2, pytest.param(3, marks=pytest.mark.slow)]


@pytest.mark.parametrize("n", WORKER_COUNTS)
def test_every_worker_ends_with_the_same_weights(weights, n):
  first, *others = weights(n)["workers"]
  assert len(others) == n - 1
  for other in others:
    for key, value in first.items():
      np.testing.assert_array_equal(other[key], value, err_msg=key)


@pytest.mark.parametrize("n", WORKER_COUNTS)
def test_workers_match_one_process_with_the_same_global_batches(weights, n):
  (reference,) = weights(n)["one_process"]
  worker = weights(n)["workers"][0]
  assert set(worker) == set(reference)
  for key, expected in reference.items():
    np.testing.assert_allclose(worker[key], expected, rtol=0, atol=1e-5,
                               err_msg=key)
    if key.startswith("eval/"):  # Exact eval: same examples, same result.
      examples, _, metric = worker[key]
      assert examples == train_weights.EVAL_SIZE
      if key == f"eval/{train_weights.USER}":  # MAE: a sum of floats.
        assert metric == pytest.approx(expected[2], rel=1e-6)
      else:  # Accuracy: a count.
        assert metric == expected[2]
      continue
    if not key.startswith("initial/"):  # Guard: training really moved it.
      assert np.abs(expected - reference[f"initial/{key}"]).max() > 1e-4


def _train_args(workdir, *extra):
  return ["-m", "dist_keras.train", f"--workdir={workdir}",
          "--config.train.steps=6", "--config.train.log_every=3",
          "--config.train.checkpoint_every=3", "--config.eval.every=3",
          "--config.data.train_size=512", "--config.data.eval_size=128",
          "--config.data.seq_len=12", "--config.model.units=16",
          "--config.train.global_batch_size=32",
          "--config.log.calibration_steps=2",
          # A known MFU peak: no timed matmul at start (test_flops.py times it).
          "--config.log.peak_tflops=1.0", *extra]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
  """One 2-worker run of _train_args, read by the tests below: across two
  network namespaces (two hosts of their own) where they can be made, else
  on loopback through launch_local.py (each cluster is ~15 CPU-s, and CI
  has 15 minutes). Its workers run _SLOW_CHIEF_LOGGED_EXIT: the chief's
  replica computes SLOW_MS longer each step and its last write takes 15 s,
  and both log their final barrier and exit to `events` (the straggler's
  and the ending's tests read the same run). {'no_namespaces': why not, or
  None; 'stdout': the workers' output; 'stderr'; 'workdir'; 'events';
  'scratch_left': what the workers left in their TMPDIR, a folder of this
  run's own (other tests' killed workers leave theirs in the shared one)}."""
  folder = tmp_path_factory.mktemp("two_workers")
  workdir, tmp, events = folder / "run", folder / "tmp", folder / "events"
  tmp.mkdir()
  command = ["-c", _SLOW_CHIEF_LOGGED_EXIT.replace("SLOW_MS", str(SLOW_MS)),
             *_train_args(workdir)[2:]]  # Not -m dist_keras.train.
  env = {"TMPDIR": str(tmp), "EVENTS": str(events), "SLOW_TASK": "0"}
  reason = _make_two_hosts()
  if reason:
    result = _launch(2, command, **env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    stdout, stderr = result.stdout, result.stderr
  else:
    try:
      stdout, stderr = _train_on_two_hosts(command, env)
    finally:
      _remove_two_hosts()
  return {"no_namespaces": reason, "stdout": stdout, "stderr": stderr,
          "workdir": workdir, "events": events,
          "scratch_left": [n for n in os.listdir(tmp)
                           if n.startswith("dist_keras_worker_")]}


def test_only_the_chief_writes_the_workdir(two_workers):
  workdir, stdout = two_workers["workdir"], two_workers["stdout"]
  # Progress and results are printed once, by the chief (worker 0).
  assert "[w0] done: 6 steps" in stdout
  assert "[w1] done" not in stdout
  assert "[w1] step" not in stdout
  # Each says it waits for the other before TensorFlow's runtime starts.
  assert ("[w1] dist_keras: worker:1 waits for the other tasks to start "
          "(worker:0 at ") in stdout
  assert "[w0] dist_keras: worker:0 saw every other task start after " in (
      stdout)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["strategy"] == "MultiWorkerMirroredStrategy"
  assert summary["replicas"] == 2 and summary["steps"] == 6
  events = helpers.event_files(str(workdir))
  assert len(events) == 1, events  # One set of summaries.
  names = set(os.listdir(workdir))
  assert names == {"checkpoints", "config.json", "model.keras", ".lock",
                   "summary.json", os.path.basename(events[0])}, names
  checkpoints = os.listdir(workdir / "checkpoints")
  assert "checkpoint" in checkpoints and any(
      n.startswith("ckpt-6") for n in checkpoints), checkpoints
  # The other worker's scratch checkpoints are gone.
  assert not two_workers["scratch_left"]


def test_a_finished_workdir_rerun_by_two_workers_is_kept(two_workers,
                                                         tmp_path):
  """Both workers agree that the run had finished (one collective), write
  nothing and exit 0."""
  workdir = tmp_path / "run"
  shutil.copytree(two_workers["workdir"], workdir)
  before = {n: (workdir / n).read_bytes()
            for n in ("summary.json", "model.keras", "config.json")}
  result = _launch(2, _train_args(workdir), TMPDIR=str(tmp_path))
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert ("[w0] this workdir already finished at step 6 (train.steps "
          "reached)") in result.stdout, result.stdout
  assert "[w0] done: 6 steps" in result.stdout
  assert {n: (workdir / n).read_bytes() for n in before} == before


def test_a_bad_tf_config_fails_before_tensorflow_starts(tmp_path):
  bad = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1"]},
                    "task": {"type": "worker", "index": 0}})
  result = helpers.run_module(_train_args(tmp_path / "run"), timeout=60,
                              env={"TF_CONFIG": bad})
  assert result.returncode == 2
  assert "dist_keras: error: TF_CONFIG address \"127.0.0.1:1\" is both" in (
      result.stderr)
  assert not (tmp_path / "run").exists()


def _two_workers_exit(workdir, *args_of_task, train_args=_train_args):
  """[(exit code, stderr)] of two workers started by hand on 127.0.0.1,
  task i with `train_args` and args_of_task[i] (one tuple: both tasks')."""
  workers = [f"127.0.0.1:{port}" for port in helpers.free_ports(2)]
  tasks = args_of_task * 2 if len(args_of_task) == 1 else args_of_task
  procs = [subprocess.Popen(
      [sys.executable, *train_args(workdir, *tasks[i])],
      cwd=helpers.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=dict(ENV, PYTHONPATH=f"{helpers.REPO}:{helpers.TESTS}",
                          TF_CONFIG=json.dumps(
          {"cluster": {"worker": workers},
           "task": {"type": "worker", "index": i}})))
           for i in range(2)]
  errs = [proc.communicate(timeout=300)[1] for proc in procs]
  return [(proc.returncode, err) for proc, err in zip(procs, errs)]


def test_workers_started_with_different_configs_are_refused(tmp_path):
  """Both refuse in one line (exit 2): no shape error in a collective, and
  no lost peer for the worker still receiving the digest sum's last ring
  step when the other left (it said 'Aborting RingReduce', exit 200)."""
  for code, err in _two_workers_exit(tmp_path / "run",
                                     ["--config.model.units=8"],
                                     ["--config.model.units=16"]):
    assert code == 2, err[-2000:]
    assert err.startswith("dist_keras: error: the workers were started with "
                          "different configs (this worker's digest "), err
  assert not (tmp_path / "run" / "config.json").exists()


# In the slow set (a cluster, ~17 CPU-s): CI meets a refusal every worker
# makes together (leaving.refused_together, then exit) on two real workers
# in test_workers_started_with_different_configs_are_refused, and
# divergence's own way there under multi-worker training in
# tests/distribute/test_leaving.py's
# test_workers_stopping_at_divergence_meet_before_they_leave.
@pytest.mark.slow
def test_workers_that_diverge_stop_together_with_the_same_line(tmp_path):
  """The loss is all-reduced: every worker stops at the same step (exit
  3), none says it lost a peer that left first."""
  for code, err in _two_workers_exit(
      tmp_path / "run", ["--config.train.optimizer=sgd",
                         "--config.train.learning_rate=1e38"]):
    assert code == 3, err[-2000:]
    assert err.startswith("dist_keras: error: loss "), err[-2000:]


def _user_args(data_name, model_name="model_fn"):
  """_two_workers_exit's train_args for tests/user_task.py's `model_name`
  and `data_name`."""
  def user_args(workdir):
    return ["-m", "dist_keras.train", f"--workdir={workdir}",
            f"--config.model.name=user_task:{model_name}",
            f"--config.data.name=user_task:{data_name}",
            "--config.train.global_batch_size=48",
            "--config.train.steps=6", "--config.log.calibration_steps=0",
            "--config.log.peak_tflops=1.0"]
  return user_args


def test_workers_whose_model_fn_built_different_models_are_refused(
    tmp_path):
  """Worker 1's model_fn builds relu where worker 0's builds tanh, and
  clips its gradients: the same weights' shapes. Both trained silently
  (exit 0): gradients averaged over two functions, the chief's eval of
  neither. Both now refuse at build with the same line naming what
  differs, before anything is written."""
  results = _two_workers_exit(tmp_path / "run", [], train_args=_user_args(
      "dataset_fn", "model_fn_of_its_own_on_worker_1"))
  for code, err in results:
    assert code == 2, err[-2000:]
    assert _our_error(err) == (
        "dist_keras: error: the workers' model_fn built different models: "
        "the architecture differs between worker:0 and worker:1 (layers[1]."
        'config.activation: "tanh" against "relu"); the optimizer differs '
        "between worker:0 and worker:1 (clipnorm: null against 1); "
        "build and compile the same model on every worker (the same code "
        "and values): its gradients are averaged over the workers, which "
        "trains no one model."), err[-2000:]
  assert not (tmp_path / "run").exists()


def test_one_workers_refused_data_stops_both_with_its_line_naming_it(
    tmp_path):
  """Only worker 1's batches hold labels the model cannot take: it refuses
  at its first step (exit 2), and worker 0, waiting in that step's
  all-reduce, says the same line naming it, exit 2: it said 'lost contact
  with task worker:1 ...; the job must restart' (exit 200, retryable),
  which a restart meets again."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  (code_0, err_0), (code_1, err_1) = _two_workers_exit(
      tmp_path / "run", [], train_args=_user_args(
          "out_of_range_labels_on_pipeline_1_dataset_fn", "classes_model_fn"))
  assert code_1 == errors.EXIT_CONFIG_ERROR, err_1[-2000:]
  # Worker 1's stderr is its line alone (TensorFlow's log of the abort
  # the report makes here is left out).
  [line] = err_1.strip().splitlines()
  assert line.startswith("dist_keras: error: a batch holds a value the model "
                         "cannot take (Received a label value of "), err_1
  assert code_0 == errors.EXIT_CONFIG_ERROR, err_0[-2000:]
  assert _our_error(err_0) == line.replace(
      "dist_keras: error: ", "dist_keras: error: worker:1 stopped the job: ")
  assert not (tmp_path / "run").exists()  # As a refusal on one worker.


def test_workers_that_disagree_on_an_eval_split_are_refused(tmp_path):
  """Worker 1's dataset_fn has no eval split (None), worker 0's has one:
  worker 0 would run the eval's collectives alone. Both refuse at build
  with the same line, before anything is written."""
  for code, err in _two_workers_exit(tmp_path / "run", [], train_args=(
      _user_args("no_eval_on_pipeline_1_dataset_fn"))):
    assert code == 2, err[-2000:]
    assert _our_error(err).startswith(
        "dist_keras: error: dataset_fn('eval', ...) returned a dataset for 1"
        " of the 2 replicas and None (no eval split) for the others (this "
        "worker: "), err[-2000:]
  assert not (tmp_path / "run").exists()


# The check's logic runs in CI at 2 replicas (test_user_pipelines.py); the
# refusal across workers shares leaving.refused_together with the eval
# split's disagreement above.
@pytest.mark.slow
def test_workers_whose_dataset_fn_does_not_shard_are_refused(tmp_path):
  """Each worker's one pipeline read the whole split, the same stream:
  every step trained on its first 24 examples twice, silently (exit 0).
  Both refuse at build with the same line, before anything is written."""
  for code, err in _two_workers_exit(tmp_path / "run", [], train_args=(
      _user_args("unsharded_dataset_fn"))):
    assert code == 2, err[-2000:]
    assert _our_error(err) == (
        "dist_keras: error: dataset_fn('train', ...) gives input pipelines "
        "0 and 1 (of 2, one per worker) the same first batch (24 examples):"
        " it does not shard by input_context, so every step's global batch "
        "of 48 would hold the same 24 examples 2 times over, which one "
        "device never trains on; shard it in dataset_fn, ds.shard("
        "input_context.num_input_pipelines, input_context.input_pipeline_id)"
        " before batching (dist_keras never auto-shards; Keras' fit does)."
    ), err[-2000:]
  assert not (tmp_path / "run").exists()


# Every stream of unknown size in the slow set: the same switch
# (pipelines._whole_batches) stops both, and CI's case fails without it.
@pytest.mark.parametrize("data_name", [
    "dry_on_pipeline_1_dataset_fn",
    pytest.param("dry_on_pipeline_1_of_unknown_sizes_dataset_fn",
                 marks=pytest.mark.slow)])
def test_one_workers_train_stream_running_dry_stops_both_with_its_line(
    tmp_path, data_name):
  """Only worker 1's train stream ends (after 2 batches, its size unknown
  at build): it says so (exit 2), and worker 0, waiting in that call's
  all-reduce, says the same line naming it (exit 2). With TensorFlow's
  partial-batch handling, which a worker turns on for a stream of unknown
  size, both failed at step 1 in a collective mismatch (exit 1) beside a
  repeat()ed peer; where every stream's size was unknown, worker 1 trained
  on empty batches to the end, and both exited 0."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  (code_0, err_0), (code_1, err_1) = _two_workers_exit(
      tmp_path / "run", [], train_args=_user_args(data_name))
  assert code_1 == errors.EXIT_CONFIG_ERROR, err_1[-2000:]
  [line] = err_1.strip().splitlines()
  assert line == (
      "dist_keras: error: dataset_fn('train', ...) ran out of batches at "
      "steps 2-5; repeat it (ds.repeat()) so training runs train.steps=6 "
      "steps."), err_1
  assert code_0 == errors.EXIT_CONFIG_ERROR, err_0[-2000:]
  assert _our_error(err_0) == line.replace(
      "dist_keras: error: ", "dist_keras: error: worker:1 stopped the job: ")
  assert not (tmp_path / "run").exists()  # No checkpoint: a refusal.


# A worker of a 2-worker run whose replica computes SLOW_MS longer than its
# peer's (a sleep between its batch and its forward pass) when it is task
# $SLOW_TASK, and that logs to $EVENTS ("TASK WHAT SECONDS", the host's
# monotonic clock) as it waits at the final barrier and as it exits; the
# chief's last write (summary.json) takes 15 s, past the coordination
# service's heartbeat timeout (10 s). The two_workers fixture runs it.
_SLOW_CHIEF_LOGGED_EXIT = """
import json, os, sys, time
import tensorflow as tf
from tensorflow.python.eager import context
from dist_keras import train
from dist_keras.training import run_files, steps
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
forward_backward = steps.forward_backward
def slow(model, optimizer, batch, update_metrics=True, variables=None):
  flat = tf.nest.flatten(batch)
  late = tf.py_function(lambda t: (time.sleep(SLOW_MS / 1e3), t)[1],
                        [flat[0]], flat[0].dtype)
  late.set_shape(flat[0].shape)
  return forward_backward(model, optimizer, tf.nest.pack_sequence_as(
      batch, [late, *flat[1:]]), update_metrics, variables)
if task == int(os.environ["SLOW_TASK"]):
  steps.forward_backward = slow
def log(what):
  with open(os.environ["EVENTS"], "a") as events:
    events.write(f"{task} {what} {time.monotonic()}\\n")
service = context.context()
wait_at_barrier = service.wait_at_barrier
def logged_wait(*args):
  log("barrier-start")
  wait_at_barrier(*args)
  log("barrier-end")
service.wait_at_barrier = logged_wait
write_json = run_files.write_json
def slow_write(workdir, name, value):
  if name == run_files.SUMMARY_JSON:
    time.sleep(15)
  write_json(workdir, name, value)
run_files.write_json = slow_write
exit_now = os._exit
os._exit = lambda code: (log(f"exit-{code}"), exit_now(code))
sys.argv[0] = "dist_keras.train"
train.run()
"""
SLOW_MS = 300


def test_the_chief_logs_the_jobs_straggler_wait_when_it_is_the_slowest(
    two_workers):
  """The chief's replica computes 300 ms longer: it waits for no one, the
  other worker's replica waits ~300 ms for it. The chief's sync/straggler_ms
  is the job's mean (~150 ms), its max the other's wait (it read 0, the
  chief's own replica's, when each worker reported its own). It logs
  every replica's compute, the job's numbering (the chief's first): the
  other worker's replica 1 ~300 ms below its own (it had its own only)."""
  tags = helpers.scalar_tags(str(two_workers["workdir"]))
  # Timed steps 3 and 6 (step 1 warmed the timed step function up).
  assert [s for s, _ in tags["sync/straggler_ms"]] == [3, 6], tags
  for name, least in (("compute_ms", SLOW_MS), ("straggler_max_ms",
                                                SLOW_MS * 0.8),
                      ("straggler_ms", SLOW_MS * 0.4)):
    assert all(v > least for _, v in tags[f"sync/{name}"]), (name, tags)
  for (_, mean), (_, worst) in zip(tags["sync/straggler_ms"],
                                   tags["sync/straggler_max_ms"]):
    assert mean == pytest.approx(worst / 2, rel=1e-6)  # (0 + wait) / 2
  assert sorted(t for t in tags if t.startswith("sync_replica/")) == sorted(
      f"sync_replica/{i}/{name}" for i in (0, 1) for name in (
          "compute_ms", "input_wait_ms", "outside_ms", "callbacks_ms")), tags
  # Both workers' host time between calls reaches the chief: the worst's.
  for (_, worst), (_, chief), (_, other) in zip(
      tags["sync/outside_max_ms"], tags["sync_replica/0/outside_ms"],
      tags["sync_replica/1/outside_ms"]):
    assert worst == max(chief, other) >= 0
  for (_, own), (_, chief), (_, other) in zip(
      tags["sync/compute_ms"], tags["sync_replica/0/compute_ms"],
      tags["sync_replica/1/compute_ms"]):
    assert chief == pytest.approx(own, rel=1e-6)
    assert 0 < other < chief - SLOW_MS * 0.8, tags


# --- Two hosts of their own: network namespaces joined by a veth pair -------

_NETNS = ("dk_host_a", "dk_host_b")
_ADDRESSES = ("10.213.0.1", "10.213.0.2")


def _sh(*args):
  return subprocess.run(args, capture_output=True, text=True, check=False)


def _make_two_hosts():
  """Creates two namespaces with a veth pair; returns a skip reason or None."""
  if os.geteuid() != 0:
    return "needs root to create network namespaces"
  if shutil.which("ip") is None:
    return "needs iproute2's `ip`"
  _remove_two_hosts()
  a, b = _NETNS
  steps = [("ip", "netns", "add", a), ("ip", "netns", "add", b),
           ("ip", "link", "add", "dk_veth_a", "type", "veth", "peer", "name",
            "dk_veth_b"),
           ("ip", "link", "set", "dk_veth_a", "netns", a),
           ("ip", "link", "set", "dk_veth_b", "netns", b)]
  for ns, dev, addr in ((a, "dk_veth_a", _ADDRESSES[0]),
                        (b, "dk_veth_b", _ADDRESSES[1])):
    steps += [("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
              ("ip", "-n", ns, "link", "set", dev, "up"),
              ("ip", "-n", ns, "link", "set", "lo", "up")]
  for step in steps:
    result = _sh(*step)
    if result.returncode:
      _remove_two_hosts()
      return f"`{' '.join(step)}` failed: {result.stderr.strip()}"
  return None


def _remove_two_hosts():
  for ns in _NETNS:
    _sh("ip", "netns", "del", ns)  # Deletes its end of the veth pair too.
  # A pair made by a run killed before it moved the pair into the namespaces.
  _sh("ip", "link", "del", "dk_veth_a")


def _train_on_two_hosts(command, env):
  """Each worker in its namespace, started by launch_local.py as on two
  hosts (--worker_hosts, --task_index), running `python COMMAND` with
  `env`; returns their stdout and their stderr."""
  hosts = ",".join(f"{addr}:23456" for addr in _ADDRESSES)
  procs = [subprocess.Popen(
      ["ip", "netns", "exec", ns, sys.executable, LAUNCHER,
       f"--worker_hosts={hosts}", f"--task_index={i}", "--",
       sys.executable, *command],  # One filesystem: shared disk.
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(ENV, PYTHONPATH=helpers.REPO, **env))
           for i, ns in enumerate(_NETNS)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0, f"worker {i}:\n{out[-2000:]}{err[-3000:]}"
  return tuple("".join(stream) for stream in zip(*outputs))


def test_two_workers_train_across_two_network_namespaces(two_workers):
  if two_workers["no_namespaces"]:
    pytest.skip(f"{two_workers['no_namespaces']} (the run went over "
                "loopback)")
  assert "[w0] done: 6 steps" in two_workers["stdout"]
  summary = json.loads((two_workers["workdir"] / "summary.json").read_text())
  assert summary["replicas"] == 2


# Hung in the slow set (~46 s, its heartbeat's wait): the survivor's line
# and exit are the killed peer's, and test_cli.py reads TensorFlow's
# heartbeat-timeout error as a lost peer in process.
@pytest.mark.parametrize("how", [
    "killed", pytest.param("hung", marks=pytest.mark.slow)])
def test_a_lost_worker_makes_the_other_exit_retryably_naming_it(tmp_path, how):
  """Killed (SIGKILL) or hung (SIGSTOP): the survivor must not wait forever.

  No launcher here: it would stop the survivor itself. A hung peer is found
  by TensorFlow's coordination-service heartbeat (~12 s measured).
  """
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  hosts = [f"127.0.0.1:{p}" for p in helpers.free_ports(2)]
  procs = []
  for i in range(2):
    tf_config = json.dumps({"cluster": {"worker": hosts},
                            "task": {"type": "worker", "index": i}})
    procs.append(subprocess.Popen(
        # No evals nor checkpoints, which nothing here reads: the peer is
        # lost in a training step's collective.
        [sys.executable, *_train_args(tmp_path / "run"),
         "--config.train.steps=100000", "--config.train.log_every=5",
         "--config.eval.every=0", "--config.train.checkpoint_every=100000",
         # A start that never comes (a peer that ended after it was seen, or
         # a stranger at its port) ends this soon, its line shown below.
         "--config.runtime.peer_start_timeout_seconds=120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=helpers.REPO, env=dict(ENV, TF_CONFIG=tf_config,
                                   PYTHONPATH=helpers.REPO,
                                   PYTHONUNBUFFERED="1")))
  try:
    for line in procs[0].stdout:  # Training is under way on both.
      if line.startswith("step"):
        break
    else:  # Worker 0 ended before a step: each worker's last words.
      for p in procs:
        p.kill()
      pytest.fail("\n".join(f"worker {i}: exit {p.wait()}: "
                             f"{p.stderr.read()[-1500:]}"
                             for i, p in enumerate(procs)))
    os.kill(procs[1].pid, signal.SIGKILL if how == "killed"
            else signal.SIGSTOP)
    killed_at = time.monotonic()
    _, stderr = procs[0].communicate(timeout=120)
    seconds = time.monotonic() - killed_at
  finally:
    for p in procs:
      p.kill()
  assert procs[0].returncode == errors.EXIT_PEER_LOST, stderr[-2000:]
  assert seconds < 60
  last = _our_error(stderr)
  assert last.startswith("dist_keras: error: lost contact with task worker:1")
  assert "rerun it on every worker" in last


def _our_error(stderr: str) -> str:
  """dist_keras' one error line: TF's shutdown logging (gRPC, the
  coordination service) may print after it on a loaded machine."""
  ours = [line for line in stderr.splitlines()
          if line.startswith("dist_keras: error: ")]
  assert len(ours) == 1, stderr[-2000:]
  return ours[0]


# What TensorFlow printed at the end of successful runs whose workers left
# one by one, with no final barrier.
_TF_EXIT_ERRORS = ("UNAVAILABLE", "heartbeat", "crashed",
                   "Failed to send RPC", "coordination service")


def test_a_finished_run_ends_together_without_tensorflow_errors(two_workers):
  """Every worker waits at a barrier until all have finished (here the
  chief's last write, 15 s), and the chief exits after the others have.
  A worker that had left at its last collective was reported by the
  chief as crashed ("The tasks have crashed"); one that outlived the
  chief said "Failed to send RPC to coordination service"."""
  output = two_workers["stdout"] + two_workers["stderr"]
  assert not [line for line in output.splitlines()
              if any(text in line for text in _TF_EXIT_ERRORS)], output
  logged = {}
  for line in two_workers["events"].read_text().splitlines():
    task, what, seconds = line.split()
    logged.setdefault(int(task), {})[what] = float(seconds)
  chief, worker = logged[0], logged[1]
  # The worker waited for the chief's last write.
  assert worker["barrier-end"] > chief["barrier-start"] > (
      worker["barrier-start"] + 10), logged
  assert chief["barrier-end"] < chief["exit-0"], logged
  assert worker["barrier-end"] < worker["exit-0"] < chief["exit-0"], logged


@pytest.mark.parametrize("n", WORKER_COUNTS)
def test_workers_evaluate_every_example_exactly_once(weights, n):
  """123 eval examples in global batches of 48: the last one partial and
  split unevenly (tests/scripts/eval_ids.py's pass, run by the weights'
  workers after training)."""
  per_worker = weights(n)["eval_ids"]
  assert len(per_worker) == n
  assert all(len(ids) for ids in per_worker)  # Every worker took part.
  np.testing.assert_array_equal(np.sort(np.concatenate(per_worker)),
                                np.arange(train_weights.EVAL_SIZE))


def test_sigterm_to_one_worker_stops_both_at_one_step_with_a_checkpoint(
    tmp_path):
  """The signal reaches worker 1 only; the workers agree at the next
  log_every step, both save that step's checkpoint and exit 143, worker 0
  naming its peer's request (a rerun
  resumes from a checkpoint: test_resume.py restarts a 2-worker run,
  test_cli.py reruns a Ctrl-C-stopped one)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  hosts = [f"127.0.0.1:{p}" for p in helpers.free_ports(2)]
  workdir = tmp_path / "run"
  args = [*_train_args(workdir), "--config.train.steps=100000",
          "--config.train.log_every=5", "--config.eval.every=0",
          "--config.train.checkpoint_every=100000"]  # The stop's own only.
  procs = []
  for i in range(2):
    tf_config = json.dumps({"cluster": {"worker": hosts},
                            "task": {"type": "worker", "index": i}})
    procs.append(subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=helpers.REPO,
        env=dict(ENV, TF_CONFIG=tf_config, PYTHONPATH=helpers.REPO,
                 PYTHONUNBUFFERED="1")))
  try:
    for line in procs[0].stdout:
      if line.startswith("step"):
        break
    procs[1].send_signal(signal.SIGTERM)
    results = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      p.kill()
  steps = []
  asked = ["a peer worker's stop request (SIGTERM, Ctrl-C or SIGHUP)",
           "SIGTERM"]
  for p, (_, stderr), by in zip(procs, results, asked):
    assert p.returncode == errors.EXIT_PREEMPTED, stderr[-2000:]
    stopped = re.match(rf"dist_keras: error: stopped by {re.escape(by)} "
                       r"after step (\d+);", _our_error(stderr))
    assert stopped, stderr[-2000:]
    assert "did not meet this worker" not in stderr  # They met to stop.
    steps.append(int(stopped.group(1)))
  assert steps[0] == steps[1] and steps[0] % 5 == 0, steps
  assert (workdir / "checkpoints" / f"ckpt-{steps[0]}.index").exists()
