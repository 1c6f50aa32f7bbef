"""One worker's own one-line error, reported to the others
(distribute/reports.py), on two real workers on 127.0.0.1: the others say
its line, naming it, with its exit code, wherever they wait for it (a
collective: test_multi_worker.py; the run's final barrier, fit's door,
here)."""
import json
import os
import subprocess
import sys

import helpers
import pytest

from dist_keras import errors

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
           PYTHONPATH=f"{helpers.REPO}:{helpers.TESTS}")


def _two_workers(script, *args, env_of_task=({}, {})):
  """[(exit code, stderr)] of `script` (python -c) run as task 0 and 1 of
  a 2-worker cluster on free loopback ports."""
  workers = [f"127.0.0.1:{port}" for port in helpers.free_ports(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-c", script, *args], cwd=helpers.REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(ENV, **env_of_task[i], TF_CONFIG=json.dumps(
          {"cluster": {"worker": workers},
           "task": {"type": "worker", "index": i}})))
           for i in range(2)]
  try:
    errs = [proc.communicate(timeout=300)[1] for proc in procs]
  finally:
    for proc in procs:
      proc.kill()
  return [(proc.returncode, err) for proc, err in zip(procs, errs)]


def _ours(stderr: str, prefix: str) -> str:
  """The one line of `stderr` that starts with `prefix`."""
  [line] = [line for line in stderr.splitlines() if line.startswith(prefix)]
  return line


# A script calling dist_keras.fit with a MultiWorkerMirroredStrategy of its
# own (its coordination service runs before fit is called), and its
# workdir and steps from the environment (which one worker lacks here).
_FIT_WITH_OWN_STRATEGY = """
import os, sys
import tensorflow as tf
import dist_keras
import user_task
strategy = tf.distribute.MultiWorkerMirroredStrategy()
try:
  dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                 workdir=os.environ.get("RUN_DIR"), strategy=strategy,
                 config={"train.steps": int(os.environ.get("STEPS", "0")),
                         "train.global_batch_size": 48,
                         "log.calibration_steps": 0, "log.peak_tflops": 1.0})
except dist_keras.UserError as e:
  print(f"error: {e}", file=sys.stderr)
  sys.exit(e.exit_code)
"""


# Refused in the run, before it joined, in the slow set: fit's door joins
# the service for both (CI's case), and a refusal in the run is reported
# alike on the command line (test_multi_worker.py's refused data).
@pytest.mark.parametrize("worker_1_lacks, start", [
    pytest.param("RUN_DIR", "workdir=None", marks=pytest.mark.slow),
    ("STEPS", "train.steps=0")])  # Refused at fit's door.
def test_a_refusal_before_the_run_joined_stops_the_peer_with_its_line(
    tmp_path, worker_1_lacks, start):
  """A refusal between the strategy's start and the run's: worker 1 was
  not yet known to the service as started, so it did not report it (after
  a 2 s probe), and worker 0, waiting in the run's first collective, lost
  it (exit 200, retryable: a restart failed alike)."""
  task_env = {"RUN_DIR": str(tmp_path / "run"), "STEPS": "6"}
  (code_0, err_0), (code_1, err_1) = _two_workers(
      _FIT_WITH_OWN_STRATEGY, env_of_task=(task_env, {
          k: v for k, v in task_env.items() if k != worker_1_lacks}))
  assert code_1 == errors.EXIT_CONFIG_ERROR, err_1[-2000:]
  line_1 = _ours(err_1, "error: ")[len("error: "):]
  assert line_1.startswith(start), line_1
  assert code_0 == errors.EXIT_CONFIG_ERROR, err_0[-3000:]
  assert _ours(err_0, "error: ") == f"error: worker:1 stopped the job: {line_1}"


# The command line's run, one of whose workers ($REFUSER) refuses after
# its last collective (the chief its results' last write, worker 1 the
# end of its run: stand-ins for any refusal of their own there); the other
# waits at the final barrier, or comes to it $LATE seconds late, after the
# report.
_REFUSES_LAST = """
import json, os, sys, time
from tensorflow.python.eager import context
from dist_keras import errors, train
from dist_keras.training import loop, run_files
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
refuser = int(os.environ["REFUSER"])
def refuse():
  time.sleep(1)
  raise errors.UserError(f"refused on worker:{task} (a test).")
write_json, run = run_files.write_json, loop.Trainer.run
def chief_refuses(workdir, name, value):
  if name == run_files.SUMMARY_JSON and task == refuser == 0:
    refuse()
  write_json(workdir, name, value)
def worker_1_refuses(self):
  summary = run(self)
  if task == refuser == 1:
    refuse()
  return summary
run_files.write_json, loop.Trainer.run = chief_refuses, worker_1_refuses
service = context.context()
wait_at_barrier = service.wait_at_barrier
def late(*args):
  time.sleep(float(os.environ["LATE"]) if task != refuser else 0)
  wait_at_barrier(*args)
service.wait_at_barrier = late
sys.argv[0] = "dist_keras.train"
train.run()
"""


# CI runs a peer at the barrier as the report comes (1, 0) and one that
# comes after it, the chief's service kept until it has read the line
# (0, 3); the slow set also each other refuser ((0, 0), (1, 4)).
@pytest.mark.parametrize("refuser, late", [
    pytest.param(0, 0, marks=pytest.mark.slow), (1, 0),
    pytest.param(1, 4, marks=pytest.mark.slow), (0, 3)])
def test_a_peer_at_the_final_barrier_says_the_refusers_line(
    tmp_path, refuser, late):
  """The other worker said 'lost contact with task worker:N as the run
  ended' (exit 200, retryable), or '... a peer task' when it came to the
  barrier after the report (TensorFlow's 'Agent must be in CONNECTED
  state'). A chief that refused and had exited before the other came (3
  s late) took the report's text with it (its service): the other said
  '... a peer task', exit 200; the chief now waits (reports.TOLD_SECONDS)
  until the other has its line."""
  args = ["--config.model.name=user_task:model_fn",
          "--config.data.name=user_task:dataset_fn",
          "--config.train.global_batch_size=48", "--config.train.steps=4",
          "--config.log.calibration_steps=0", "--config.log.peak_tflops=1.0",
          # The refusals come after training: no timed step function to
          # trace (one step function a worker, not two).
          "--config.log.sync_timing=false",
          f"--workdir={tmp_path / 'run'}"]
  env = {"REFUSER": str(refuser), "LATE": str(late)}
  results = _two_workers(_REFUSES_LAST, *args, env_of_task=(env, env))
  (code, err), (peer_code, peer_err) = (results[refuser],
                                        results[1 - refuser])
  line = f"refused on worker:{refuser} (a test)."
  assert code == errors.EXIT_CONFIG_ERROR, err[-2000:]
  assert _ours(err, "dist_keras: error: ") == f"dist_keras: error: {line}"
  assert peer_code == errors.EXIT_CONFIG_ERROR, peer_err[-2000:]
  assert _ours(peer_err, "dist_keras: error: ") == (
      f"dist_keras: error: worker:{refuser} stopped the job: {line}")


_COMMAND_LINE = """
import sys
from dist_keras import train
sys.argv[0] = "dist_keras.train"
train.run()
"""


def test_a_users_own_error_on_one_worker_stops_the_peer_with_its_line(
    tmp_path):
  """Worker 1's dataset_fn raises a RuntimeError of its own (exit 1, said
  as 'raised in dataset_fn(...)'): worker 0 said 'lost contact with task
  worker:1 ...; the job must restart' 16-32 s later (exit 200, retryable:
  a restart met the error again)."""
  args = ["--config.model.name=user_task:model_fn",
          "--config.data.name=user_task:raising_on_pipeline_1_dataset_fn",
          "--config.train.global_batch_size=48", "--config.train.steps=4",
          "--config.log.calibration_steps=0", "--config.log.peak_tflops=1.0",
          f"--workdir={tmp_path / 'run'}"]
  (code_0, err_0), (code_1, err_1) = _two_workers(_COMMAND_LINE, *args)
  assert code_1 == errors.EXIT_UNEXPECTED, err_1[-2000:]
  line = _ours(err_1, "dist_keras: error: ")
  assert line.startswith(
      "dist_keras: error: RuntimeError: my data shard is missing on this "
      "worker (raised in dataset_fn('train', ...) user_task:"), line
  assert code_0 == errors.EXIT_UNEXPECTED, err_0[-2000:]
  assert _ours(err_0, "dist_keras: error: ") == line.replace(
      "dist_keras: error: ", "dist_keras: error: worker:1 stopped the job: "
  ).replace("; rerun with --verbose for the traceback)", ")")
