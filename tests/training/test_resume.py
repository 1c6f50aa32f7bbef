"""Nothing lost: a run SIGKILLed at a random step and restarted ends with the
same weights as an uninterrupted one: the built-in LSTM on one device, and a
user's model with dropout (its random state is checkpointed: the masks after
the resume are the ones the whole run drew) on one device, 2 replicas and 2
workers."""
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers

STEPS = 30
LAUNCHER = os.path.join(helpers.REPO, "tools", "launch_local.py")
TESTS = helpers.TESTS  # user_task.py's folder.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
           PYTHONPATH=f"{helpers.REPO}:{TESTS}", PYTHONUNBUFFERED="1")


# The built-in LSTM, shrunk; a user's model with dropout 0.1 (import paths).
MODELS = {
    "lstm": ["--config.data.train_size=512", "--config.data.eval_size=64",
             "--config.data.seq_len=12", "--config.model.units=16"],
    "user_dropout": ["--config.model.name=user_task:model_fn_dropout",
                     "--config.data.name=user_task:dataset_fn",
                     "--config.train.global_batch_size=48"],
}
# One seed per session, printed: a failing kill step can be replayed with
# DIST_KERAS_TEST_SEED=<seed>.
SEED = int(os.environ.get("DIST_KERAS_TEST_SEED", random.randrange(10**6)))


def _command(workdir, strategy, workers, model):
  train = [sys.executable, "-m", "dist_keras.train", f"--workdir={workdir}",
           f"--config.runtime.strategy={strategy}",
           f"--config.train.steps={STEPS}", "--config.train.log_every=1",
           "--config.train.checkpoint_every=4", "--config.eval.every=0",
           "--config.train.global_batch_size=32",
           "--config.log.calibration_steps=0",
           # A known MFU peak: no timed matmul at start (test_flops.py).
           "--config.log.peak_tflops=1.0", *MODELS[model]]
  if not workers:
    return train
  return [sys.executable, LAUNCHER, f"--num_workers={workers}",
          "--max_restarts=1", "--grace_seconds=5", "--", *train]


def _final_weights(workdir):
  reader = tf.train.load_checkpoint(os.path.join(workdir, "checkpoints"))
  # Model weights and optimizer state alike (not the save bookkeeping, nor
  # the record of what the run measured: its timings).
  names = [n for n in reader.get_variable_to_shape_map()
           if n not in ("_CHECKPOINTABLE_OBJECT_GRAPH",)
           and not n.startswith(("save_counter", "record/"))]
  # Every model variable (dropout's seed state too) and optimizer variable.
  assert any(n.startswith("model_variables/") for n in names), names
  assert any(n.startswith("optimizer_variables/") for n in names), names
  return {n: reader.get_tensor(n) for n in names}


def _kill_at(proc, step, victim_pid=None):
  """Reads progress until `step` is logged, then SIGKILLs the victim."""
  for line in proc.stdout:
    if line.split("]")[-1].strip().startswith(f"step {step:>2}/"):
      os.kill(victim_pid or proc.pid, signal.SIGKILL)
      return
  raise AssertionError(f"step {step} was never logged")


# The user's dropout model (its random state must resume too: the harder
# case) on 2 workers in CI: a worker SIGKILLed, the cluster restarted by the
# launcher. In the slow set: one device (bitwise; CI resumes one device
# bitwise in test_fit_parity.py, stopped by an exception rather than a
# SIGKILL, and test_cli.py reruns a Ctrl-C-stopped run), 2 replicas in one
# process (test_loop.py and test_cli.py resume Mirrored runs in CI) and the
# built-in LSTM on one device (the same code as the user's model). Every
# run is 3-6 TensorFlow processes, and CI has 15 minutes.
@pytest.mark.parametrize("strategy,workers,tolerance,model", [
    pytest.param("one_device", 0, 0.0, "lstm", marks=pytest.mark.slow),
    pytest.param("one_device", 0, 0.0, "user_dropout",  # Bitwise.
                 marks=pytest.mark.slow),
    pytest.param("mirrored", 0, 1e-6, "user_dropout", marks=pytest.mark.slow),
    ("multi_worker_mirrored", 2, 1e-6, "user_dropout"),
])
def test_killed_and_restarted_run_ends_with_the_same_weights(
    tmp_path, strategy, workers, tolerance, model):
  rng = random.Random(f"{SEED}-{strategy}-{model}")
  kill_step = rng.randint(6, STEPS - 3)
  # Shown if the test fails.
  print(f"DIST_KERAS_TEST_SEED={SEED}: killing at step {kill_step}")
  # The uninterrupted reference runs alongside the cut one: it needs
  # nothing from it, and the two start-ups overlap.
  whole = subprocess.Popen(
      _command(tmp_path / "whole", strategy, workers, model),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
      cwd=TESTS)

  command = _command(tmp_path / "cut", strategy, workers, model)
  proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=ENV,
                          cwd=TESTS)
  if workers:
    # Kill one worker (worker 1's python), as a lost pod would be; the
    # launcher restarts the cluster (--max_restarts=1), which resumes.
    for line in proc.stdout:
      if line.startswith("[w0] step") and f" {kill_step}/" in line:
        break
    victim = _worker_pid(proc.pid, index=1)
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "launch_local: restart 1/1" in err
    assert "resumed from" in out
  else:
    _kill_at(proc, kill_step)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    again = subprocess.run(command, capture_output=True, text=True, env=ENV,
                           timeout=600, check=False, cwd=TESTS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout
  _, whole_err = whole.communicate(timeout=600)
  assert whole.returncode == 0, whole_err[-3000:]
  expected, got = (_final_weights(tmp_path / "whole"),
                   _final_weights(tmp_path / "cut"))
  assert expected.keys() == got.keys()
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=0, atol=tolerance,
                               err_msg=name)


def _worker_pid(launcher_pid, index):
  """The pid of the launcher's child whose TF_CONFIG task index is `index`."""
  children = subprocess.run(["pgrep", "-P", str(launcher_pid)],
                            capture_output=True, text=True,
                            check=False).stdout.split()
  for pid in children:
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        env = f.read().split(b"\0")
    except OSError:
      continue
    for item in env:
      if item.startswith(b"TF_CONFIG=") and (
          f'"index": {index}'.encode() in item):
        return int(pid)
  raise AssertionError(f"no worker {index} under launcher {launcher_pid}")
