"""The shipped configs reach their documented results (slow: minutes).

These are the README's claims, run as a user runs them: the default command
with no flags (3 seeds) and cnn_shapes, each in its own process.
"""
import json
import os
import time

import pytest

import helpers

pytestmark = pytest.mark.slow


def _run(tmp_path, *args):
  start = time.monotonic()
  result = helpers.run_module(["-m", "dist_keras.train",
                               f"--workdir={tmp_path}", *args], timeout=400)
  seconds = time.monotonic() - start
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.load(open(os.path.join(tmp_path, "summary.json")))
  print(f"{args}: {seconds:.0f} s, {summary}")
  return summary, seconds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_lstm_longmem_learns_within_3_minutes(tmp_path, seed):
  summary, seconds = _run(tmp_path, f"--config.runtime.seed={seed}")
  assert summary["replicas"] == 2
  assert summary["eval_accuracy"] >= 0.95
  assert seconds < 180


def test_cnn_shapes_reaches_90_percent(tmp_path):
  summary, _ = _run(tmp_path, "--config=configs/cnn_shapes.py")
  assert summary["eval_accuracy"] >= 0.90
