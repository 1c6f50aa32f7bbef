"""`python -m dist_keras.train` as a user runs it: output, files, errors."""
import errno
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time

import pytest

import helpers
from dist_keras import errors, installation, origins

TINY = ["--config.data.train_size=256", "--config.data.eval_size=64",
        "--config.data.seq_len=8", "--config.model.units=8",
        "--config.train.global_batch_size=32", "--config.train.steps=4",
        "--config.train.log_every=2", "--config.eval.every=0",
        # A known MFU peak: no timed matmul at start (test_flops.py times it).
        "--config.log.peak_tflops=1.0"]


# What a test of the run's output streams does not read: the timed step
# function (a second trace) and the calibration after the last step (its
# 20 steps and all-reduce fit): ~1-2 CPU-s of a ~10 CPU-s run.
UNTIMED = ["--config.log.sync_timing=false",
           "--config.log.calibration_steps=0"]


def _train(*args, env=None):
  return helpers.run_module(["-m", "dist_keras.train", *args], env=env)


def test_run_prints_progress_and_where_tensorboard_logs_are(tmp_path):
  """The handlers registered with atexit run, though the run ends with
  os._exit: a config file's (a tracker's finish), and autograph's removal
  of its generated modules (8 files a run were left in the temporary
  directory). (A blank TF_CONFIG: the closed stderr's run below.)"""
  workdir, temp = str(tmp_path / "run"), tmp_path / "tmp"
  temp.mkdir()
  config = tmp_path / "mine.py"
  config.write_text(
      "import atexit\nfrom dist_keras.configs import base\n"
      f"atexit.register(lambda: open({str(tmp_path / 'finished')!r}, 'w'))\n"
      "def get_config():\n  return base.get_config()\n")
  result = _train(f"--config={config}", f"--workdir={workdir}", *TINY,
                  env={"TMPDIR": str(temp)})
  assert result.returncode == 0, result.stderr
  assert not os.listdir(temp)
  assert (tmp_path / "finished").exists()
  assert f"tensorboard --logdir {workdir}" in result.stdout
  assert "MirroredStrategy with 2 replica(s)" in result.stdout
  assert "step 4/4" in result.stdout and "eval accuracy" in result.stdout
  # TensorFlow's start-up lines are filtered from stderr.
  assert "oneDNN" not in result.stderr and "cpu_feature" not in result.stderr
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert summary["steps"] == 4 and summary["replicas"] == 2
  # Which device kind trained: the header and summary.json say it.
  assert "MirroredStrategy with 2 replica(s) on CPU" in result.stdout
  assert summary["device_kind"] == "CPU"


# Slow: a config file by path trains from the command line above (mine.py),
# configs/*.py paths load in test_configs.py and the CNN config's run trains
# in process (test_synthetic_data.py) and on 2 workers
# (test_multi_worker.py): a TensorFlow process (~10 CPU-s) less in CI.
@pytest.mark.slow
def test_other_configs_load_by_path(tmp_path):
  """(TINY's sizes but the sequence's, which the CNN and shapes do not read:
  configs/__init__.py refuses those.)"""
  result = _train("--config=configs/cnn_shapes.py",
                  f"--workdir={tmp_path}", "--config.data.image_size=16",
                  "--config.model.filters=(8,)",
                  *[a for a in TINY if not a.startswith(
                      ("--config.data.seq_len", "--config.model.units"))])
  assert result.returncode == 0, result.stderr
  config = json.load(open(tmp_path / "config.json"))
  assert config["model"]["name"] == "cnn"


@pytest.mark.parametrize("override,message", [
    ("--config.runtime.strategy=nccl",
     "runtime.strategy='nccl' is not one of auto, mirrored, one_device"),
    ("--config.train.global_batch_size=33",
     "train.global_batch_size=33 is not divisible by the 2 replicas; use a "
     "multiple of 2."),
    ("--config.runtime.num_cpu_devices=0",
     "runtime.num_cpu_devices=0 must be >= 1."),
    ("--config.data.name=imagenet", "data.name='imagenet' is not one of"),
    ("--config.train.learning_rate=0", "train.learning_rate=0.0 must be > 0."),
    ("--config.train.learning_rate=-0.1",
     "train.learning_rate=-0.1 must be > 0."),
    ("--config.train.steps=0", "train.steps=0 must be >= 1."),
    ("--config.train.global_batch_size=0",
     "train.global_batch_size=0 must be >= 1."),
    ("--config.model.name=transformer", "model.name='transformer' is not one "
     "of"),
    ("--config.model.cell=transformer", "model.cell='transformer'"),
    ("--config.train.optimizer=lion", "train.optimizer='lion' is not one of"),
    ("--config.runtime.strategy=multi_worker_mirrored",
     "needs TF_CONFIG naming the cluster"),
])
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, override,
                                                           message):
  workdir = tmp_path / "run"
  result = _train(f"--workdir={workdir}", *TINY, override)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("dist_keras: error: ") and message in lines[0]
  assert "Traceback" not in result.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("override,message", [
    ("--config.train.stepz=3",
     "--config.train.stepz names no config key (did you mean 'steps'?)"),
    ("--config.trian.steps=3",
     "--config.trian.steps names no config key (did you mean 'train'?)"),
    ("--config.train.steps=many",
     "--config.train.steps=many is not an int: write e.g. "
     "`--config.train.steps=800`."),
    ("--config=configs/nope.py",
     "--config=configs/nope.py could not be loaded"),
    # docs/errors.md's rows for a flag and an argument the command lacks.
    ("--bogus", "Unknown command line flag 'bogus'; see --help."),
    ("extra", "unexpected arguments ['extra']; the options are --config, "
     "--workdir, --config.KEY=VALUE."),
])
def test_unknown_keys_wrong_types_and_missing_configs_exit_2(tmp_path,
                                                            override, message):
  result = _train(f"--workdir={tmp_path / 'run'}", override)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert lines == [lines[0]] and lines[0].startswith("dist_keras: error: ")
  assert message in lines[0]
  assert not (tmp_path / "run").exists()


def test_verbose_shows_the_traceback(tmp_path):
  result = _train(f"--workdir={tmp_path}", "--verbose",
                  "--config.runtime.strategy=nccl")
  assert result.returncode == 2 and "Traceback" in result.stderr


def test_without_tensorflow_fit_and_the_command_line_name_the_extras(
    tmp_path):
  """One line, no traceback, nothing written (it printed its hint, then
  import's traceback)."""
  no_tf = "import sys; sys.modules['tensorflow'] = None\n"
  result = helpers.run_module(["-c", no_tf + (
      "import dist_keras\n"
      "try:\n  dist_keras.fit(None, None, workdir='x')\n"
      "except ImportError as e:\n  print(e)\n")])
  assert result.returncode == 0, result.stderr
  # Not "pip install 'dist-keras[cpu]'": PyPI's dist-keras is another
  # project. The extra's own packages, as this installation declares them.
  assert ("pip install 'tensorflow-cpu<2.22,>=2.16' 'ml-dtypes<0.7' (CPU)"
          in result.stdout), result.stdout
  assert "dist-keras[" not in result.stdout
  result = helpers.run_module(["-c", no_tf + (
      "import runpy\n"
      f"sys.argv = ['train', '--workdir={tmp_path / 'run'}']\n"
      "runpy.run_module('dist_keras.train', run_name='__main__')\n")])
  assert result.returncode == 2
  assert result.stderr.startswith("dist_keras: error: dist_keras needs "
                                  "TensorFlow, which is installed through "
                                  "an extra: pip install 'tensorflow-cpu")
  assert result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_install_advice_from_a_checkout_names_its_extra(monkeypatch):
  """dist_keras on PYTHONPATH, not installed: no metadata to read."""
  def not_installed(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr(importlib.metadata, "requires", not_installed)
  assert installation.install("tpu") == (
      "pip install -e '.[tpu]' (in dist_keras' checkout)")


def test_console_script_is_the_same_entry_point(tmp_path):
  script = os.path.join(os.path.dirname(sys.executable), "dist-keras-train")
  assert os.path.exists(script), "pip install -e . installs dist-keras-train"
  result = subprocess.run([script, f"--workdir={tmp_path / 'run'}",
                           "--config.runtime.strategy=bogus"],
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 2
  assert "runtime.strategy='bogus'" in result.stderr


def test_the_console_script_imports_a_config_files_modules_from_here(
    tmp_path):
  """As `python -m` does: the current folder is on the path (a console
  script's own is its bin/ folder), so a config file importing the user's
  module loads alike (it was 'No module named mine', exit 2)."""
  (tmp_path / "mine.py").write_text("STEPS = 7\n")
  (tmp_path / "cfg.py").write_text(
      "from dist_keras.configs import base\nimport mine\n"
      "def get_config():\n  c = base.get_config()\n"
      "  c.train.steps = mine.STEPS\n  return c\n")
  script = os.path.join(os.path.dirname(sys.executable), "dist-keras-train")
  result = subprocess.run(
      [script, "--config=cfg.py", "--workdir=run",
       "--config.runtime.strategy=bogus"], cwd=tmp_path,
      env={**os.environ, "PYTHONPATH": helpers.REPO}, capture_output=True,
      text=True, timeout=120, check=False)
  assert result.returncode == 2, result.stderr
  assert "runtime.strategy='bogus'" in result.stderr  # Past the config.


def test_a_users_function_that_raises_is_named_in_the_one_line(tmp_path):
  """Their error, where it was raised; --verbose is not asked for again
  when given (its traceback is above the line)."""
  (tmp_path / "mine.py").write_text(
      "def model_fn():\n  raise ValueError('bad layer width -3')\n")
  args = ["-m", "dist_keras.train", "--workdir=run",
          "--config.model.name=mine:model_fn", "--config.train.steps=2"]
  result = helpers.run_module(args, cwd=tmp_path)
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1] == (
      "dist_keras: error: ValueError: bad layer width -3 (raised in "
      "model_fn mine:model_fn; rerun with --verbose for the traceback)")
  result = helpers.run_module([*args, "--verbose"], cwd=tmp_path)
  assert result.stderr.splitlines()[-1] == (
      "dist_keras: error: ValueError: bad layer width -3 (raised in "
      "model_fn mine:model_fn)") and "Traceback" in result.stderr
  assert not (tmp_path / "run").exists()


def test_a_peer_lost_at_the_final_barrier_is_a_retryable_peer_lost(
    monkeypatch):
  """A peer that died after training fails the barrier with TensorFlow's
  InternalError (measured: 7-10 s after a SIGKILL), which had read as a
  bug (exit 1); the chief that died fails it at once (UnavailableError)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras import train  # pylint: disable=g-import-not-at-top
  from dist_keras.distribute import leaving, tfconfig  # pylint: disable=g-import-not-at-top
  message = ("Barrier failed because: task is set to ERROR: UNAVAILABLE: "
             "Task /job:worker/replica:0/task:1 heartbeat timeout.")

  def barrier_failed(cluster):
    raise tf.errors.InternalError(None, None, message)

  monkeypatch.setattr(leaving, "together", barrier_failed)
  monkeypatch.setattr(train.signal, "signal", lambda *args: None)
  cluster = tfconfig.ClusterSpec({"worker": ["a:1", "b:1"]}, "worker", 0)
  with pytest.raises(errors.KNOWN) as lost:
    train._leave_together(cluster)  # pylint: disable=protected-access
  assert lost.value.exit_code == errors.EXIT_PEER_LOST
  assert str(lost.value) == (
      f"lost contact with task worker:1 as the run ended (InternalError: "
      f"{message}); rerun it on every worker (python -m dist_keras.launch "
      "--max_restarts does): a finished workdir is kept as it is, else the "
      "rerun writes the results.")


def test_a_tf_errors_cause_is_its_line_that_says_what_happened():
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  # Several root errors (Keras' fit per-call under Mirrored, 2026-12-02):
  # the first one's message.
  assert errors.cause(
      "2 root error(s) found.\n  (0) INVALID_ARGUMENT:  You must feed a value"
      " for placeholder tensor 'p'\n\t [[{{node p}}]]\n  (1) CANCELLED: "
      "other\n0 successful operations.") == (
          "You must feed a value for placeholder tensor 'p'")
  assert errors.cause("  just indented\n") == "just indented"


# What TF 2.21 raised (str of the error, trimmed) when a user's dataset map
# failed its own assertion mid-run, 2026-12-03.
_DATASET_FN_FAILED = """Graph execution error:

Detected at node assert_less/Assert/AssertGuard/Assert defined at (most recent call last):
<stack traces unavailable>
2 root error(s) found.
  (0) INVALID_ARGUMENT:  Error in user-defined function passed to MapDataset:1 transformation with iterator: Iterator::Root::Prefetch::BatchV2::ForeverRepeat[0]::ParallelMapV2: assertion failed: [feature out of range in my data] [Condition x < y did not hold element-wise:]
\t [[{{node assert_less/Assert/AssertGuard/Assert}}]]
  (1) INVALID_ARGUMENT:  Error in user-defined function passed to MapDataset:1 transformation with iterator: Iterator::Root::Prefetch::BatchV2::ForeverRepeat[0]::ParallelMapV2: assertion failed: [feature out of range in my data]
0 successful operations.
0 derived errors ignored. [Op:__inference_one_step_1119]"""


def test_an_unexpected_tf_error_is_one_line_saying_what_happened():
  """Not "Graph execution error:" (every TF runtime error's first line),
  nor "<stack traces unavailable>": the root error, with the user's own
  message in it even behind tf.data's iterator path."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  error = tf.errors.InvalidArgumentError(None, None, _DATASET_FN_FAILED)
  assert origins.unexpected(error) == (
      "InvalidArgumentError: in a tf.data function (MapDataset): assertion "
      "failed: [feature out of range in my data] [Condition x < y did not "
      "hold element-wise:]")
  assert origins.unexpected(ValueError("plain\nsecond")) == "ValueError: plain"
  # The user's map function failed, not dist_keras: the command line does
  # not call it "unexpected" (a bug's word).
  assert origins.in_users_code(error)
  assert not origins.in_users_code(tf.errors.InvalidArgumentError(
      None, None, "Graph execution error:\n\nsomething of ours"))


# What TF 2.21 raised mid-run, 2026-12-07 (str of the error, trimmed): a
# map's own check failed on one device (the iterator's frames under the
# failing node; a tf.data function's op has no stack).
_ITERATOR_FAILED = """Graph execution error:

Detected at node CheckNumerics defined at (most recent call last):
<stack traces unavailable>
a bad record : Tensor had Inf values
\t [[{{node CheckNumerics}}]]
\t [[while/body/_1/while/IteratorGetNext]] [Op:__inference_train_steps_676]"""


def _step_op_failed(frames: str, iterator_first: bool) -> str:
  """What TF 2.21 raised, 2026-12-07, when an op of a 2-replica step failed
  its check (a layer's check_numerics): where it was made (`frames`:
  "PATH:LINE:FUNCTION" a line, innermost last), then its two root errors,
  in the order that run gave (either root error can carry an iterator's
  frame: a bystander, not the failing op)."""
  node = "while/replica_1/sequential_1/__finite_1/CheckNumerics"
  stack = "".join('  File "{}", line {}, in {}\n\n'.format(*f.split(":"))
                  for f in frames.split())
  roots = [f"\t [[{{{{node {node}}}}}]]\n\t [[{bystander}]]"
           for bystander in ("MultiDeviceIteratorGetNextFromShard",
                             "while/body/_1/while/replica_1/mse/Mul/_22")]
  if not iterator_first:
    roots.reverse()
  return (f"Graph execution error:\n\nDetected at node {node} defined at "
          f"(most recent call last):\n{stack}2 root error(s) found.\n"
          "  (0) INVALID_ARGUMENT:  the model saw an inf : Tensor had Inf "
          f"values\n{roots[0]}\n  (1) INVALID_ARGUMENT:  the model saw an "
          f"inf : Tensor had Inf values\n{roots[1]}\n0 successful "
          "operations.\n0 derived errors ignored. [Op:__inference_train_"
          "steps_1665]")


def test_a_data_fault_in_the_input_pipeline_is_said_to_be_the_users_data():
  """A record the user's pipeline fails on (its own check, a corrupt file,
  a file gone) is theirs: said where, not called unexpected (a bug's
  word), and told to a cluster's peers (origins.users_own). A transient
  read stays unexpected (2 replicas in process:
  tests/contract/test_user_pipelines.py)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for kind in (tf.errors.InvalidArgumentError, tf.errors.DataLossError,
               tf.errors.NotFoundError):
    error = kind(None, None, _ITERATOR_FAILED)
    assert origins.in_users_code(error) and origins.users_own(error)
    assert origins.unexpected(error) == (
        f"{kind.__name__}: a bad record : Tensor had Inf values "
        f"({origins.IN_PIPELINE})")
  transient = tf.errors.UnavailableError(None, None, _ITERATOR_FAILED)
  assert not origins.in_users_code(transient)


def test_an_op_the_users_own_code_made_is_named_where_it_failed():
  """A check in the user's layer (loss, train_step) failing mid-run is
  theirs: the line names the line of their code that made the op (the
  innermost frame past TF's, Keras' and Python's own), whichever root
  error an iterator's frame is in. An op dist_keras made stays
  unexpected, as does the user's op failing otherwise than a check
  (another error class). 2 replicas in process, its real text:
  tests/contract/test_model_checks.py."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  python = os.path.dirname(os.__file__)
  ours = os.path.dirname(os.path.dirname(os.path.abspath(errors.__file__)))
  keras_src = os.path.join(os.path.dirname(keras.__file__), "src")
  step = (f"{python}/threading.py:1002:_bootstrap "
          f"{ours}/dist_keras/training/steps.py:82:forward_backward "
          f"{ours}/dist_keras/contract/model_calls.py:21:forward "
          f"{keras_src}/layers/layer.py:1002:__call__ ")
  users = step + f"/home/me/mine/layers.py:4:call {keras_src}/ops/nn.py:9:f"
  for iterator_first in (True, False):
    error = tf.errors.InvalidArgumentError(
        None, None, _step_op_failed(users, iterator_first))
    assert origins.users_own(error)
    assert origins.unexpected(error) == (
        "InvalidArgumentError: the model saw an inf : Tensor had Inf values "
        "(raised by the op made at /home/me/mine/layers.py:4 in call)")
    assert not origins.in_users_code(tf.errors.InvalidArgumentError(
        None, None, _step_op_failed(step, iterator_first)))
  assert not origins.in_users_code(tf.errors.ResourceExhaustedError(
      None, None, _step_op_failed(users, True)))
  # The user's own package installed beside Keras (a virtualenv's
  # site-packages lies under its platstdlib; without one, under Python's
  # stdlib) is theirs too.
  installed = os.path.join(sysconfig.get_paths()["purelib"], "mypkg", "l.py")
  error = tf.errors.InvalidArgumentError(None, None, _step_op_failed(
      step + f"{installed}:7:call", True))
  assert origins.unexpected(error).endswith(
      f"(raised by the op made at {installed}:7 in call)")


def _until_stopped(workdir, log_every: int) -> list:
  """The arguments of a tiny run only a signal ends (no checkpoint before
  it); `_resumed` reruns them to a given step."""
  return ["-m", "dist_keras.train", f"--workdir={workdir}",
          "--config.train.steps=100000",
          f"--config.train.log_every={log_every}",
          "--config.train.checkpoint_every=100000",
          "--config.data.seq_len=12", "--config.model.units=16",
          "--config.log.calibration_steps=0"]


def _resumed(args: list, steps: int, strategy) -> dict:
  """`args`' run (from _until_stopped) rerun with train.steps=`steps`, in
  this process (a TensorFlow process less): the config the command line
  makes of them, through dist_keras.fit; returns summary.json. (The
  command line's own rerun resumes in test_resume.py's 2-worker case.)"""
  from dist_keras import configs  # pylint: disable=g-import-not-at-top
  from dist_keras import train  # pylint: disable=g-import-not-at-top
  _, overrides = train.split_overrides(
      [arg if not arg.startswith("--config.train.steps=")
       else f"--config.train.steps={steps}" for arg in args])
  config = configs.from_command_line(configs.DEFAULT, overrides)
  workdir = next(arg for arg in args if arg.startswith("--workdir="))
  return helpers.train(config, workdir[len("--workdir="):], strategy)


# One rerun is enough: what a rerun resumes from is the same checkpoint
# whichever signal stopped the run (each TensorFlow process is ~15 CPU-s,
# and CI has 15 minutes). SIGTERM in the slow set: the same handler and
# stop as Ctrl-C's; CI sees the command line's SIGTERM line, step and
# checkpoint on 2 workers (test_multi_worker.py) and its exit 143 in
# test_a_closed_pipe_still_exits_143.
@pytest.mark.parametrize("signum,said,code,rerun", [
    pytest.param(signal.SIGTERM, "SIGTERM", errors.EXIT_PREEMPTED, False,
                 marks=pytest.mark.slow),
    (signal.SIGINT, "Ctrl-C (SIGINT)", errors.EXIT_INTERRUPTED, True)])
def test_a_stop_signal_checkpoints_the_current_step_and_a_rerun_resumes(
    tmp_path, signum, said, code, rerun, mirrored, capsys):
  """SIGTERM (preemption) and Ctrl-C: the step the run is at is saved, one
  line says so (after Ctrl-C's notice), the same command resumes."""
  workdir = tmp_path / "run"
  args = _until_stopped(workdir, log_every=5)
  proc = subprocess.Popen(
      [sys.executable, *args], cwd=helpers.REPO, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO,
               PYTHONUNBUFFERED="1"),
      # As a terminal's foreground job has it (a test runner may ignore it).
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  for line in proc.stdout:
    if line.startswith("step"):
      break
  proc.send_signal(signum)
  start, lines = time.monotonic(), []
  for line in proc.stderr:
    lines.append(line)
    if line.startswith("dist_keras: error: "):
      break
  said_at = time.monotonic()
  proc.wait(timeout=60)
  # Gone as soon as it has said so: no wait on tf.data's threads (7-30 s
  # when Python's own exit destroyed the stopped iterator).
  assert time.monotonic() - said_at < 5
  assert said_at - start < 60
  stderr = "".join(lines) + proc.stderr.read()
  assert proc.returncode == code, stderr[-2000:]
  assert "Traceback" not in stderr, stderr[-2000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith(f"dist_keras: error: stopped by {said} after step ")
  assert stderr.count("dist_keras: error: ") == 1, stderr[-2000:]  # Once.
  step = int(last.split("after step ")[1].split(";")[0])
  # Stopped at the end of the call it was in (the signal came after step
  # 1's line), not at a later log or checkpoint step. Counted in steps, not
  # seconds: that call may be a trace, 1 s alone and 14 s under CI's load.
  assert step <= 5
  assert f"checkpoint ckpt-{step} saved" in last
  assert os.path.exists(f"{workdir}/checkpoints/ckpt-{step}.index")
  assert not (workdir / "summary.json").exists()
  if not rerun:
    return
  # The same settings (fewer steps, to finish) resume at that step.
  assert _resumed(args, step + 5, mirrored)["steps"] == step + 5
  out = capsys.readouterr().out
  assert f"at step {step}" in out
  assert ("config changed since this workdir's last run: train.steps "
          f"100000 -> {step + 5} (config.json takes this run's with its "
          "first checkpoint)" in out)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["steps"] == step + 5


def test_a_closed_terminal_checkpoints_the_step_and_exits_143(tmp_path):
  """An ssh session that drops: the run's terminal (a pty here) is gone
  and SIGHUP arrives; every progress line from then on would fail (EIO),
  so the run stops writing to it, saves the step it is at and exits 143
  (retryable; a rerun resumes from that checkpoint as after any stop
  signal: the Ctrl-C case above reruns one)."""
  workdir = tmp_path / "run"
  args = _until_stopped(workdir, log_every=1)
  terminal, its_end = os.openpty()
  proc = subprocess.Popen(
      [sys.executable, *args], cwd=helpers.REPO, stdin=its_end,
      stdout=its_end, stderr=its_end,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO),
      preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
  os.close(its_end)
  seen = b""
  while b"\nstep" not in seen:
    seen += os.read(terminal, 4096)
  os.close(terminal)  # The session is gone, then the kernel's SIGHUP.
  proc.send_signal(signal.SIGHUP)
  assert proc.wait(timeout=60) == errors.EXIT_PREEMPTED
  saved = sorted(int(name.split("-")[1].split(".")[0]) for name in
                 os.listdir(workdir / "checkpoints") if name.endswith(".index"))
  assert saved and saved[-1] > 0, saved


def test_help_is_the_same_from_both_entry_points_and_exits_0(tmp_path):
  """`python -m dist_keras.train --help` and the console script's `-h`:
  the usage, the exit codes and the flags (absl's own help exits 1, and
  gave the console script no usage at all)."""
  module = _train("--help")
  script = os.path.join(os.path.dirname(sys.executable), "dist-keras-train")
  if not os.path.exists(script):
    pytest.skip("dist-keras-train is not installed in this environment")
  console = subprocess.run([script, "-h"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, check=False)
  assert module.returncode == console.returncode == 0, module.stderr
  assert module.stdout == console.stdout
  for text in ("python -m dist_keras.train --config=NAME|PATH.py",
               "201 no checkpoint", "--workdir: Run folder", "--[no]verbose"):
    assert text in module.stdout, text


def test_a_closed_pipe_still_exits_143(tmp_path):
  """`... 2>&1 | tee log` whose tee is gone: the last line's write fails
  (EPIPE), but the exit code is still the stop's (was 1: not retried)."""
  workdir = tmp_path / "run"
  args = _until_stopped(workdir, log_every=1)
  reader, writer = os.pipe()
  proc = subprocess.Popen(
      [sys.executable, *args], cwd=helpers.REPO, stdout=writer,
      stderr=writer,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO))
  os.close(writer)
  seen = b""
  while b"\nstep" not in seen:
    seen += os.read(reader, 4096)
  os.close(reader)  # The pipe's reader is gone.
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == errors.EXIT_PREEMPTED
  # The step it was at is saved, as after any stop signal.
  assert any(name.endswith(".index")
             for name in os.listdir(workdir / "checkpoints"))
  assert not (workdir / "summary.json").exists()


def test_a_ctrl_c_outside_the_loop_is_one_line_and_exit_130(monkeypatch,
                                                           capsys):
  """Before training (TensorFlow's start, building) or a second Ctrl-C: no
  traceback, exit 130, and the line says nothing of this step was saved."""
  from dist_keras import train  # pylint: disable=g-import-not-at-top
  if not train.flags.FLAGS.is_parsed():
    train.flags.FLAGS(["dist_keras.train"])

  def pressed(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(train, "_train", pressed)
  with pytest.raises(SystemExit) as exited:
    train.main(["dist_keras.train"])
  assert exited.value.code == errors.EXIT_INTERRUPTED
  assert capsys.readouterr().err.splitlines() == [
      "dist_keras: error: stopped by Ctrl-C without a checkpoint of the step "
      "it was at; rerun the same command to resume from the last one, if "
      "any."]


def test_a_bad_value_prints_no_header_before_its_error(tmp_path):
  result = _train(f"--workdir={tmp_path / 'run'}", "--config.model.name=x")
  assert result.returncode == 2 and result.stdout == ""


@pytest.mark.parametrize("tf_config,message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, '
     '"task": {"type": "worker", "index": 3}}',
     "TF_CONFIG task index 3 but cluster.worker has 1 address(es)"),
])
def test_bad_tf_config_exits_2_with_one_line(tmp_path, tf_config, message):
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path / 'run'}", *TINY],
      env={"TF_CONFIG": tf_config})
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], result.stderr
  assert not (tmp_path / "run").exists()


def test_unwritable_workdir_exits_2(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a folder")
  result = _train(f"--workdir={blocker}/run", *TINY)
  assert result.returncode == 2
  # Refused before TensorFlow starts: no run header.
  assert result.stdout == ""
  assert result.stderr.strip().splitlines()[-1] == (
      f"dist_keras: error: --workdir={blocker}/run is not writable ({blocker} "
      "is a file); pass a folder you can write to.")


def test_an_empty_workdir_is_refused_in_one_line(tmp_path):
  """`--workdir=$WORKDIR` with the variable unset: it trained into a new
  runs/<timestamp> (every retry after a preemption started over)."""
  result = helpers.run_module(["-m", "dist_keras.train", "--workdir=",
                               *TINY], cwd=tmp_path)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.splitlines() == [
      "dist_keras: error: --workdir= names no folder (an unset variable?); "
      "pass the run's folder (a rerun with the same one resumes), or leave "
      "--workdir out for a new runs/<timestamp>."]
  assert not os.listdir(tmp_path)


def test_a_run_that_named_its_own_workdir_says_it_to_resume(tmp_path):
  """Without --workdir the run trains in a new runs/<timestamp>: "rerun the
  same command" alone would start afresh in another one."""
  result = helpers.run_module(
      ["-m", "dist_keras.train", *TINY, "--config.train.optimizer=sgd",
       "--config.train.learning_rate=1e38", "--config.train.global_clipnorm=0"],
      cwd=tmp_path)
  assert result.returncode == errors.EXIT_DIVERGED, result.stderr[-2000:]
  (workdir,) = os.listdir(tmp_path / "runs")
  assert re.fullmatch(
      r"dist_keras: error: loss \S+ at step \d+: training diverged; no "
      r"checkpoint was saved before it\. .*, then rerun from step 0\. "
      rf"\(this run named its own workdir: add --workdir=runs/{workdir} to "
      r"the command to rerun in it\)", result.stderr.splitlines()[-1])


def test_fit_refuses_an_empty_workdir(tmp_path, monkeypatch):
  """(It trained into the current folder.) Its lines name fit's argument,
  workdir=, as its config's name config['KEY']: they said --workdir=, the
  command line's flag, and to leave it out, which fit cannot."""
  import dist_keras  # pylint: disable=g-import-not-at-top
  import user_task  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  (tmp_path / "blocker").write_text("x")
  for workdir, line in [
      ("", "workdir='' names no folder (an unset variable?); pass the run's "
           "folder (a rerun with the same one resumes)."),
      ("blocker/run", f"workdir='blocker/run' is not writable "
                      f"({tmp_path}/blocker is a file); pass a folder you "
                      "can write to.")]:
    with pytest.raises(errors.UserError, match=f"^{re.escape(line)}$"):
      dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                     workdir=workdir,
                     config={"train.steps": 2, "log.progress": False,
                             "train.global_batch_size": user_task.GLOBAL_BATCH},
                     strategy="one_device")
  assert os.listdir(tmp_path) == ["blocker"]


def test_a_stdout_that_fails_does_not_end_the_run(tmp_path):
  """Every line of the run goes through one guarded print: a stdout that
  fails (here /dev/full: ENOSPC from the header on) goes to /dev/null
  and the run ends as done (it was exit 1 at the header; the same with
  EPIPE at the last line after `| head`)."""
  if not os.path.exists("/dev/full"):
    pytest.skip("no /dev/full here")
  workdir = tmp_path / "run"
  with open("/dev/full", "w", encoding="utf-8") as full:
    result = subprocess.run(
        [sys.executable, "-m", "dist_keras.train", f"--workdir={workdir}",
         *TINY, *UNTIMED], cwd=helpers.REPO, stdout=full,
        stderr=subprocess.PIPE,
        text=True, timeout=300, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                 PYTHONPATH=helpers.REPO))
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stderr == ""
  assert json.loads((workdir / "summary.json").read_text())["steps"] == 4


def test_a_stdout_closed_at_the_start_is_no_error_at_the_exit(monkeypatch):
  """`>&-`: Python's sys.stdout is None; the exit's flush took it for a
  stream (AttributeError, exit 1, after a finished run)."""
  from dist_keras import train  # pylint: disable=g-import-not-at-top

  class _Exited(Exception):
    pass

  def finished(*args, **kwargs):
    raise SystemExit(0)

  def exit_now(code):
    raise _Exited(code)

  monkeypatch.setattr(train.app, "run", finished)
  monkeypatch.setattr(train.os, "_exit", exit_now)
  # (This process is pytest's: its own at-exit handlers must wait.)
  monkeypatch.setattr(train.atexit, "_run_exitfuncs", lambda: None)
  monkeypatch.setattr(sys, "stdout", None)
  with pytest.raises(_Exited) as exited:
    train.run()
  assert exited.value.args == (0,)


def test_a_stderr_closed_at_the_start_does_not_end_the_run(tmp_path):
  """`2>&-`: Python's sys.stderr is None, and the replay of TensorFlow's
  start-up lines took it for a stream (AttributeError, exit 1, before
  TensorFlow started, nothing written). Its TF_CONFIG is blank, a
  template's empty value: no cluster (it was a JSONDecodeError from
  TensorFlow's resolver, exit 1); one run for both (each is ~10 CPU-s)."""
  workdir = tmp_path / "run"
  result = subprocess.run(
      ["sh", "-c", 'exec "$@" 2>&-', "sh", sys.executable, "-m",
       "dist_keras.train", f"--workdir={workdir}", *TINY, *UNTIMED],
      cwd=helpers.REPO, capture_output=True, text=True, timeout=300,
      check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                            PYTHONPATH=helpers.REPO, TF_CONFIG=" "))
  assert result.returncode == 0, result.stdout[-2000:]
  assert "done: 4 steps" in result.stdout
  assert "MirroredStrategy with 2 replica(s) on CPU" in result.stdout
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["steps"] == 4 and summary["replicas"] == 2
  assert summary["strategy"] == "MirroredStrategy"


def test_sys_exit_without_a_code_exits_0_and_says_nothing(monkeypatch,
                                                        capsys):
  """sys.exit() means 0 in Python; run() made it exit 1, printing "None"."""
  from dist_keras import train  # pylint: disable=g-import-not-at-top

  class _Exited(Exception):
    pass

  def exit_now(code):
    raise _Exited(code)

  monkeypatch.setattr(train.app, "run", lambda *args, **kwargs: sys.exit())
  monkeypatch.setattr(train.os, "_exit", exit_now)
  # (This process is pytest's: its own at-exit handlers must wait.)
  monkeypatch.setattr(train.atexit, "_run_exitfuncs", lambda: None)
  with pytest.raises(_Exited) as exited:
    train.run()
  assert exited.value.args == (0,)
  assert capsys.readouterr() == ("", "")


# A finished run of a 2-worker cluster whose workers wait for a peer that
# does not come, as it leaves (distribute/leaving.py), signalled there.
_SIGNAL_WHILE_LEAVING = """
import os, signal, sys, time
from dist_keras import api, train
from dist_keras.distribute import leaving
def finished_run(job):
  # The run's handler, kept to the exit, ignores a signal once it ended.
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda *args: None)
def waiting(cluster):
  os.kill(os.getpid(), signal.{signal})
  time.sleep(30)
  print("outlived the signal by 30 s", file=sys.stderr, flush=True)
api.run, leaving.together = finished_run, waiting
sys.argv[0] = "dist_keras.train"
train.run()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_request_while_cluster_workers_leave_ends_it_at_once(
    tmp_path, signum):
  """The run's handler, kept to the exit, ignored SIGTERM and Ctrl-C there,
  and the worker waited on until SIGKILL. Now their default action ends
  it (-15 and -2 here; 143 and 130 to a shell or Kubernetes)."""
  script = _SIGNAL_WHILE_LEAVING.replace("{signal}", signum.name)
  cluster = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                        "task": {"type": "worker", "index": 1}})
  result = helpers.run_module(
      ["-c", script, f"--workdir={tmp_path / 'run'}", *TINY],
      env={"TF_CONFIG": cluster}, timeout=120)
  assert "outlived" not in result.stderr
  assert result.returncode == -signum, result.stderr[-2000:]


_FULL_DISK = """
import errno, sys
from dist_keras import api, train
def build(job):
  raise OSError(errno.ENOSPC, "No space left on device", job.workdir + "/model.tmp.keras")
api.build = build
train.run()
"""


def test_a_full_disk_is_said_in_one_line_not_as_a_bug(tmp_path):
  """It was 'OSError: [Errno 28] ... (unexpected; rerun with --verbose ...)',
  or TensorFlow's ResourceExhaustedError naming a temp file, as for a bug;
  a rerun after freeing space resumes (docs/errors.md). The other disk
  faults: tests/training/test_disk_faults.py."""
  from dist_keras import disk  # pylint: disable=g-import-not-at-top
  result = helpers.run_module(["-c", _FULL_DISK, f"--workdir={tmp_path}",
                               *TINY], timeout=120)
  assert result.returncode == 1, result.stderr
  # (The script imports TensorFlow before the run quiets its start-up.)
  assert result.stderr.splitlines()[-1] == (
      f"dist_keras: error: no space left on device writing model.tmp.keras "
      f"in {tmp_path} (OSError); free space where the workdir is and rerun "
      "the same command: no checkpoint is kept there, so it starts from "
      "step 0.")
  tf_text = ("w/checkpoints/ckpt-16_temp/part-00000-of-00001.data-00000-of-"
             "00001.tempstate123; No space left on device [Op:SaveV2]")
  assert "writing checkpoints/ckpt-16_temp/part-00000-of-00001.data-00000-" \
         "of-00001 in w (RuntimeError in SaveV2)" in str(
             disk.fault(RuntimeError(tf_text), "w"))
  assert disk.fault(OSError(errno.EACCES, "Permission denied"), "w") is None
