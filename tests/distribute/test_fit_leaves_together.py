"""dist_keras.fit on a cluster outside Ray Train: the workers of a run that
finished leave together when their scripts end, the chief last
(distribute/leaving.py's at_exit, armed by api.run); the command line
leaves at its own end (tests/distribute/test_multi_worker.py).

CI: when it is registered and armed (a finished multi-worker fit, not
under Ray Train, not the command line's run; once a process; a failed run
disarms it). Slow: two processes of
a user's script, one of which goes on for 15 s after fit returns.
"""
import atexit
import json
import os
import subprocess
import sys
import types

import pytest
import tensorflow as tf

import helpers
from dist_keras import api, errors
from dist_keras.distribute import leaving, strategies

_TWO_WORKERS = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                "task": {"type": "worker", "index": 1}}


@pytest.fixture(name="handlers")
def _handlers(monkeypatch):
  """What the process registers with atexit (as a fresh process)."""
  handlers = []
  monkeypatch.setattr(atexit, "register", handlers.append)
  monkeypatch.setattr(leaving, "_AT_EXIT", leaving._AtExit())  # pylint: disable=protected-access
  monkeypatch.setenv("TF_CONFIG", json.dumps(_TWO_WORKERS))
  return handlers


def _exit(handlers, monkeypatch) -> list:
  """Calls the registered handlers as the interpreter's exit does; returns
  the barriers they waited at."""
  barriers = []
  monkeypatch.setattr(leaving.context, "context", lambda: types.SimpleNamespace(
      wait_at_barrier=lambda name, timeout_ms: barriers.append(name)))
  for handler in reversed(handlers):
    handler()
  return barriers


def _strategy(num_workers):
  """A strategy spanning `num_workers` processes, as api.run reads it."""
  spec = tf.train.ClusterSpec(
      {"worker": [f"127.0.0.1:{i + 1}" for i in range(num_workers)]})
  return types.SimpleNamespace(
      cluster_resolver=types.SimpleNamespace(cluster_spec=lambda: spec))


def _run(monkeypatch, num_workers=2, fails=None, to_exit=False):
  """api.run of a run built on a strategy of `num_workers` that finishes,
  or raises `fails` in training."""

  def train():
    if fails is not None:
      raise fails
    return {"steps": 1}

  strategy = _strategy(num_workers)
  trainer = types.SimpleNamespace(
      run=train, model=None, history=types.SimpleNamespace(history={}),
      strategy=strategy, parts=types.SimpleNamespace(
          role=strategies.Role(strategy, chief=True, workers=num_workers),
          model_file="model.keras"))

  class Built:

    def __enter__(self):
      return trainer

    def __exit__(self, *exc_info):
      return False

  monkeypatch.setattr(api, "build", lambda job: Built())
  # Absolute: under Ray Train a relative workdir is refused (ray_report.py).
  return api.run(api.Job(config=None, workdir=os.path.abspath("w"),
                         to_exit=to_exit))


def test_a_finished_cluster_run_leaves_together_at_exit_once(
    handlers, monkeypatch):
  """fit twice in one process: one handler, one barrier at exit."""
  _run(monkeypatch)
  _run(monkeypatch)
  assert len(handlers) == 1
  assert _exit(handlers, monkeypatch) == [leaving.BARRIER]


@pytest.mark.parametrize("fails", [
    errors.Preempted("stopped by SIGTERM"), errors.Diverged("nan"),
    errors.Interrupted("Ctrl-C"),
    tf.errors.UnavailableError(None, None, "peer gone")])
def test_a_failed_run_leaves_alone_at_exit(handlers, monkeypatch, fails):
  """Its peers may never come to the barrier: the process would wait
  there up to FINISH_SECONDS (after an earlier run that finished too)."""
  _run(monkeypatch)
  with pytest.raises((Exception, KeyboardInterrupt, SystemExit)):
    _run(monkeypatch, fails=fails)
  assert not _exit(handlers, monkeypatch)


@pytest.mark.parametrize("why", ["one worker", "the command line",
                                 "Ray Train"])
def test_nothing_is_registered_where_the_process_leaves_otherwise(
    handlers, monkeypatch, why):
  """One worker has nobody to wait for; the command line leaves itself
  (train.py, then os._exit); Ray Train keeps its workers until every
  fit has returned and then ends them itself."""
  if why == "Ray Train":
    ray_train = types.ModuleType("ray.train")
    ray_train.get_context = lambda: types.SimpleNamespace(
        get_world_rank=lambda: 1)
    monkeypatch.setitem(sys.modules, "ray.train", ray_train)
  _run(monkeypatch, num_workers=1 if why == "one worker" else 2,
       to_exit=why == "the command line")
  assert not handlers


# A user's script: dist_keras.fit on the TF_CONFIG cluster, then, on the
# worker named by argv[2], 15 s more (past the coordination service's
# heartbeat timeout, 10 s) before the script ends. A handler it registered
# before fit runs after dist_keras' (atexit is last in, first out).
_USER_SCRIPT = """
import atexit, json, os, sys, time
import dist_keras, user_task
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
atexit.register(lambda: print(f"exiting {time.time()}", flush=True))
dist_keras.fit(user_task.model_fn, user_task.dataset_fn, workdir=sys.argv[1],
               config={"train.global_batch_size": user_task.GLOBAL_BATCH,
                       "train.steps": 4, "train.log_every": 2,
                       "train.checkpoint_every": 4, "eval.every": 4,
                       "log.progress": False, "log.calibration_steps": 0})
if task == int(sys.argv[2]):
  time.sleep(15)
print(f"script ended {time.time()}", flush=True)
"""
# What TensorFlow printed on the other task (the chief, "The tasks have
# crashed"; worker 1, "Failed to send RPC to coordination service").
_TF_EXIT_ERRORS = ("UNAVAILABLE", "heartbeat", "crashed", "Failed to send RPC",
                   "coordination service")


@pytest.mark.slow
@pytest.mark.parametrize("goes_on", [0, 1], ids=["chief", "worker"])
def test_fit_on_a_cluster_ends_without_tensorflow_errors(tmp_path, goes_on):
  """The chief's script going on past the heartbeat timeout made the
  chief say worker 1 had crashed; worker 1's, that it failed to reach the
  service. Now the other waits for it as its interpreter exits."""
  hosts = [f"127.0.0.1:{port}" for port in helpers.free_ports(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-c", _USER_SCRIPT, str(tmp_path / "run"),
       str(goes_on)], cwd=helpers.TESTS, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env=dict(
          os.environ, PYTHONPATH=helpers.REPO,
          TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
              {"cluster": {"worker": hosts},
               "task": {"type": "worker", "index": i}})))
           for i in range(2)]
  try:
    outputs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      p.kill()
  said = "".join(out + err for out, err in outputs)
  assert [p.returncode for p in procs] == [0, 0], said[-3000:]
  assert not [line for line in said.splitlines()
              if any(text in line for text in _TF_EXIT_ERRORS)], said
  times = [dict(line.rsplit(" ", 1) for line in out.splitlines()
                if line.startswith(("exiting", "script ended")))
           for out, _ in outputs]
  waited = times[1 - goes_on]
  assert float(waited["exiting"]) > float(times[goes_on]["script ended"])
  assert float(times[0]["exiting"]) > float(times[1]["exiting"])  # Chief last.
