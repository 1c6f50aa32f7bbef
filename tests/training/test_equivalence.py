"""Gradient aggregation is exact: N replicas == one device, to 1e-5.

Each replica count runs in its own process (collectives cannot mix group
sizes in one process); the runs go in parallel to save wall time.
"""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import train_weights

RUNS = {"one_device": ("one_device", 1), "mirrored_1": ("mirrored", 1),
        "mirrored_2": ("mirrored", 2), "mirrored_4": ("mirrored", 4)}
# The runs started together, on first use: CI's (one device against 2
# replicas), and the slow set's 1 and 4 replicas (each run is a TensorFlow
# process training three models, and CI has 15 minutes).
GROUPS = (("one_device", "mirrored_2"), ("mirrored_1", "mirrored_4"))
COMPARED = [pytest.param("mirrored_1", marks=pytest.mark.slow), "mirrored_2",
            pytest.param("mirrored_4", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
  """`weights[run]`: {name: array} of `run`, its group trained on first
  use (the group's processes in parallel, to save wall time)."""
  out = tmp_path_factory.mktemp("weights")
  trained = functools.cache(lambda group: _train(out, group))

  class ByRun:
    def __getitem__(self, run):
      (group,) = [g for g in GROUPS if run in g]
      return trained(group)[run]

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


MODELS = ["lstm_longmem", "cnn_shapes", train_weights.USER]


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
