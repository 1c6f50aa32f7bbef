"""TensorFlow used before fit under a TF_CONFIG cluster (keras.io's
FeatureSpace script calls adapt() at import): MultiWorkerMirroredStrategy
must configure its collectives at program start. Every worker refused in
one line naming dist_keras.prepare_runtime(), which at the top of the
script makes the strategy there, and fit trains under it."""
import json
import os
import subprocess
import sys

import pytest

import helpers

_SCRIPT = """
import sys
import dist_keras
if sys.argv[2] == "prepare":
  dist_keras.prepare_runtime()  # The first thing, before TensorFlow starts.
import numpy as np
import keras
import tensorflow as tf
norm = keras.layers.Normalization()
norm.adapt(np.arange(10, dtype="float32")[:, None])  # TensorFlow starts.


def model_fn():
  model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  return model


def dataset_fn(split, ic):
  if split != "train":
    return None  # (No eval, as Keras' fit without validation_data.)
  x = np.arange(64, dtype="float32")[:, None]
  ds = tf.data.Dataset.from_tensor_slices((norm(x), x)).shard(
      ic.num_input_pipelines, ic.input_pipeline_id)
  return ds.repeat().batch(ic.get_per_replica_batch_size(8),
                           drop_remainder=True)


try:
  r = dist_keras.fit(model_fn, dataset_fn, workdir=sys.argv[1],
                     config={"train.steps": 2, "train.global_batch_size": 8,
                             "log.tensorboard": False,
                             "log.calibration_steps": 0,
                             "log.progress": False})
except dist_keras.UserError as e:
  print("refused:", e, flush=True)
  sys.exit(2)
print("trained:", r.summary["strategy"], r.summary["replicas"], flush=True)
"""


def _two_workers(tmp_path, mode):
  """Both workers' (returncode, stdout, stderr), started by hand: a
  launcher would stop the second as soon as the first refused."""
  script = tmp_path / "script.py"
  script.write_text(_SCRIPT)
  hosts = [f"127.0.0.1:{port}" for port in helpers.free_ports(2)]
  procs = [subprocess.Popen(
      [sys.executable, str(script), str(tmp_path / mode), mode],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO,
               TF_CONFIG=json.dumps({"cluster": {"worker": hosts},
                                     "task": {"type": "worker",
                                              "index": i}})))
           for i in range(2)]
  try:
    outputs = [proc.communicate(timeout=180) for proc in procs]
  finally:
    helpers.stop(procs)
  return [(proc.returncode, out, err)
          for proc, (out, err) in zip(procs, outputs)]


def test_every_worker_refuses_in_one_line_naming_prepare_runtime(tmp_path):
  """Worker 0 died with TensorFlow's traceback (RuntimeError: Collective
  ops must be configured at program startup); worker 1 was told to rerun
  the same command, which cannot help."""
  for code, out, err in _two_workers(tmp_path, "refused"):
    assert code == 2, err[-3000:]
    assert out == (
        "refused: TF_CONFIG names a cluster of 2 task(s) but TensorFlow "
        "started before fit (a layer, tensor or adapt() at import?), and "
        "MultiWorkerMirroredStrategy must configure its collectives at "
        "program start; call dist_keras.prepare_runtime() at the top of the "
        "script, before anything uses TensorFlow, or make "
        "tf.distribute.MultiWorkerMirroredStrategy() there and pass it as "
        "strategy=.\n"), err[-3000:]
    assert "Traceback" not in err and "rerun" not in err
  assert not (tmp_path / "refused").exists()  # Nothing written.


# A second 2-process run, which trains (15-21 s at load 5-6).
@pytest.mark.slow
def test_prepare_runtime_first_makes_the_cluster_strategy(tmp_path):
  for code, out, err in _two_workers(tmp_path, "prepare"):
    assert code == 0, err[-3000:]
    assert out.endswith("trained: MultiWorkerMirroredStrategy 2\n"), err
  assert json.loads((tmp_path / "prepare" / "summary.json").read_text())[
      "steps"] == 2
