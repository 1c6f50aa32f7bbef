"""A script that uses TensorFlow before fit (keras.io's: a layer's adapt(),
a tensor or layers at import) fixes TensorFlow's devices at one CPU: fit's
default (runtime.strategy=auto) trains on it and says so, a split asked for
is refused naming the call that gets it, and that call works."""
import helpers

_TF_FIRST = """
import sys, tempfile
import tensorflow as tf
tf.constant(1.0)  # TensorFlow starts: one logical CPU device.
import dist_keras, user_task
config = {"train.global_batch_size": user_task.GLOBAL_BATCH, "train.steps": 2,
          "eval.every": 0, "log.calibration_steps": 0, "log.progress": False}
for overrides in ({"runtime.strategy": "mirrored"},
                  {"runtime.num_cpu_devices": 3},
                  {"runtime.num_cpu_devices": 2}):  # Set: at the default too.
  try:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=tempfile.mkdtemp(dir=sys.argv[1]) + "/run",
                   config=dict(config, **overrides))
  except dist_keras.UserError as e:
    print("refused:", e, flush=True)
r = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=tempfile.mkdtemp(dir=sys.argv[1]), config=config)
print("trained on", r.summary["replicas"], flush=True)
"""


def _run(script, tmp_path):
  return helpers.run_module(
      ["-c", script, str(tmp_path)],
      env={"PYTHONPATH": f"{helpers.REPO}:{helpers.REPO}/tests"})


def test_tensorflow_started_before_fit(tmp_path):
  """'runtime.num_cpu_devices=2 but TensorFlow already started with 1
  logical CPU device(s); set it before anything else uses TensorFlow' did
  not say how, and came with fit's defaults too: 3 of 7 keras.io scripts
  ported stopped there. A count set in fit's config is refused even at the
  default (it trained 1 replica with auto's line)."""
  result = _run(_TF_FIRST, tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  refused = [line for line in result.stdout.splitlines()
             if line.startswith("refused:")]
  assert refused == [
      f"refused: runtime.num_cpu_devices={n} but TensorFlow already started "
      "with 1 logical CPU device(s) (a layer, tensor or adapt() made before "
      "fit starts it); call dist_keras.prepare_runtime(num_cpu_devices="
      f"{n}) at the top of the script, before anything uses TensorFlow, or "
      "set runtime.num_cpu_devices=1." for n in (2, 3, 2)]
  assert (
      "dist_keras: TensorFlow started before fit (a layer, tensor or adapt() "
      "at import?) with 1 logical CPU device(s), so runtime.strategy=auto "
      "trains on 1 replica(s), not runtime.num_cpu_devices=2; for 2, call "
      "dist_keras.prepare_runtime(num_cpu_devices=2) before anything uses "
      "TensorFlow.\n") in result.stdout
  assert "trained on 1\n" in result.stdout


_PREPARED = """
import sys, tempfile
import dist_keras
try:
  dist_keras.prepare_runtime(num_cpu_devices=0)
except dist_keras.UserError as e:
  print("refused:", e)
dist_keras.prepare_runtime(num_cpu_devices=2)
import tensorflow as tf
tf.constant(1.0)
import user_task
r = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=tempfile.mkdtemp(dir=sys.argv[1]),
                   config={"train.global_batch_size": user_task.GLOBAL_BATCH,
                           "train.steps": 2, "eval.every": 0,
                           "log.calibration_steps": 0, "log.progress": False,
                           "runtime.strategy": "mirrored"})
print("trained on", r.summary["replicas"], flush=True)
"""


def test_prepare_runtime_splits_the_cpu_before_tensorflow_starts(tmp_path):
  result = _run(_PREPARED, tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[0] == (
      "refused: runtime.num_cpu_devices=0 must be >= 1.")
  assert "trained on 2\n" in result.stdout
