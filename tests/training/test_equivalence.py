"""Gradient aggregation is exact: N replicas == one device, to 1e-5.

CI's pair (one device against the 2 replicas every test process has)
trains in this process; the slow set's 1 and 4 replicas each run in a
process of their own (collectives cannot mix group sizes in one process),
in parallel to save wall time.
"""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import train_weights

# The slow set's runs, each a process of its own (started together).
RUNS = {"mirrored_1": ("mirrored", 1), "mirrored_4": ("mirrored", 4)}
COMPARED = [pytest.param("mirrored_1", marks=pytest.mark.slow), "mirrored_2",
            pytest.param("mirrored_4", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory, mirrored):
  """`weights[run]`: {name: array} of `run`, trained on first use: one
  device and 2 replicas here (a TensorFlow process less each), the slow
  set's runs in their own processes."""
  out = tmp_path_factory.mktemp("weights")
  here = {"one_device": tf.distribute.OneDeviceStrategy("/cpu:0"),
          "mirrored_2": mirrored}
  in_process = functools.cache(lambda run: train_weights.models_after_training(
      train_weights.MODELS, here[run]))
  in_processes = functools.cache(lambda: _train(out, tuple(RUNS)))

  class ByRun:
    def __getitem__(self, run):
      return in_process(run) if run in here else in_processes()[run]

  return ByRun()


def _train(out, group):
  procs = {}
  for name in group:
    strategy, devices = RUNS[name]
    procs[name] = subprocess.Popen(
        [sys.executable, os.path.join(helpers.REPO, "tests", "scripts",
                                      "train_weights.py"),
         f"--strategy={strategy}", f"--devices={devices}",
         f"--out={out / name}.npz"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  result = {}
  for name, proc in procs.items():
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{log[-3000:]}"
    result[name] = dict(np.load(out / f"{name}.npz"))
  return result


MODELS = list(train_weights.MODELS)


@pytest.mark.parametrize("run", COMPARED)
@pytest.mark.parametrize("model", MODELS)
def test_replicas_match_one_device(weights, run, model):
  reference = {k: v for k, v in weights["one_device"].items()
               if k.startswith(model)}
  assert reference
  for key, expected in reference.items():
    np.testing.assert_allclose(weights[run][key], expected, rtol=0, atol=1e-5,
                               err_msg=f"{run} {key}")


@pytest.mark.parametrize("run", COMPARED)
@pytest.mark.parametrize("model", MODELS)
def test_eval_is_exact_whatever_the_replica_count(weights, run, model):
  """123 eval examples: 2 and 4 replicas get partial and empty batches.

  Built-ins: accuracy counts hits, the same number exactly; the user's MAE
  and every loss are sums of floats, equal to float32 rounding."""
  examples, loss, metric = weights[run][f"eval/{model}"]
  _, ref_loss, ref_metric = weights["one_device"][f"eval/{model}"]
  assert examples == train_weights.EVAL_SIZE
  assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-6)
  if model == train_weights.USER:
    assert metric == pytest.approx(ref_metric, rel=1e-6)
  else:
    assert metric == ref_metric


def test_training_moved_every_weight_far_beyond_the_tolerance(weights):
  """Guards the test above against comparing (nearly) untrained weights."""
  ref = weights["one_device"]
  for key in [k for k in ref if not k.startswith(("initial/", "eval/"))]:
    moved = np.abs(ref[key] - ref[f"initial/{key}"]).max()
    assert moved > 1e-4, f"{key} moved only {moved}"  # 10x the tolerance
