"""examples/ run as their docstrings say (few steps): a user's own model
through the Python API, and a user's module + config through the command
line as 2 workers; the Ray example's driver refuses a bad argument before
Ray starts (its run under Ray: tests/distribute/test_ray.py, slow)."""
import json
import os
import subprocess
import sys

import pytest

import helpers

EXAMPLES = os.path.join(helpers.REPO, "examples")


def test_own_model_trains_through_the_python_api(tmp_path):
  result = helpers.run_module(
      [os.path.join(EXAMPLES, "own_model.py"), f"--workdir={tmp_path}",
       "--steps=20"], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "eval MAE " in result.stdout
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["steps"] == 20 and summary["eval_examples"] == 1024
  assert summary["eval_mae"] < 0.64  # Better than always predicting 0.
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["model"]["name"] == "__main__:model_fn"


def test_binary_config_runs_as_two_workers_from_its_folder(tmp_path):
  """The config names binary_task's functions; each worker imports them."""
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-m", "dist_keras.launch", "--num_workers=2", "--",
       sys.executable, "-m", "dist_keras.train", "--config=binary_config.py",
       f"--workdir={workdir}", "--config.train.steps=20",
       "--config.train.log_every=10", "--config.eval.every=0",
       "--config.log.calibration_steps=0", "--config.log.peak_tflops=1.0"],
      cwd=os.path.join(EXAMPLES, "binary"), capture_output=True, text=True,
      timeout=600, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO))
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert "[w0] done: 20 steps, eval accuracy" in result.stdout
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["strategy"] == "MultiWorkerMirroredStrategy"
  assert summary["replicas"] == 2 and summary["eval_examples"] == 2000
  assert summary["eval_auc"] > 0.5
  assert summary["allreduce_ms"] > 0  # The sync breakdown ran.


@pytest.mark.parametrize("argument,line", [
    ("--steps=-3", "ray_train.py: error: train.steps=-3 must be >= 1."),
    ("--workers=0", "ray_train.py: error: --workers=0 must be >= 1 (with 0, "
     "Ray runs the loop in this driver"),
])
def test_ray_example_refuses_a_bad_argument_before_ray_starts(
    tmp_path, argument, line):
  """Ray retries a worker group that failed (--max_failures), a config
  error too: the driver checks first. A `ray` that fails on import shows
  that Ray was not started."""
  fake_ray = tmp_path / "fake" / "ray"
  fake_ray.mkdir(parents=True)
  (fake_ray / "__init__.py").write_text(
      "raise ImportError('the driver imported ray')\n")
  result = subprocess.run(
      [sys.executable, os.path.join(EXAMPLES, "ray_train.py"),
       f"--workdir={tmp_path / 'run'}", f"--storage={tmp_path / 'ray'}",
       argument], cwd=str(tmp_path), capture_output=True, text=True,
      timeout=300, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([helpers.REPO,
                                           str(tmp_path / "fake")])))
  assert result.returncode == 2, result.stderr[-3000:]
  ours = [l for l in result.stderr.splitlines()
          if not l.startswith(("WARNING: All log messages", "I0000", "W0000"))]
  assert len(ours) == 1 and ours[0].startswith(line), result.stderr
  assert not (tmp_path / "run").exists() and not (tmp_path / "ray").exists()
