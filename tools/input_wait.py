"""How long the replicas wait for input: sync/input_wait_ms per config.

For every config in configs/ (or --configs=a,b), trains --steps steps on 2
logical CPU replicas, each config in its own process, and prints the mean
input wait of the instrumented steps against the step time. TFDS configs
read `tfds.testing.mock_data` (random examples with the dataset's real
features, generated in the input pipeline: there is no network here), so
their figure covers dist_keras's preprocessing, batching and prefetching,
not disk reads. A benchmark, not a test.

  python tools/input_wait.py --steps=300
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import mock_tfds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET_BATCH = 32


@contextlib.contextmanager
def _mock_tfds(c, data_dir: str):
  """tfds.testing.mock_data for a TFDS config, with its metadata on disk."""
  from dist_keras.data import tfds_sources  # pylint: disable=g-import-not-at-top
  if not tfds_sources.is_tfds(c.data.name):
    yield
    return
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = tfds_sources.dataset_name(c.data.name)
  mock_tfds.write_metadata(name, data_dir, 4096)
  c.data.data_dir = data_dir
  kwargs = {}
  if name == "tiny_shakespeare":
    # Mock strings are a few bytes long: give the LM one long random text
    # per split, as the real dataset has (~1 MB train).
    text = np.random.default_rng(0).integers(32, 127, 1 << 20).astype(
        np.uint8).tobytes()
    kwargs["as_dataset_fn"] = lambda *a, **k: tf.data.Dataset.from_tensors(
        {"text": tf.constant(text)})
  with tfds.testing.mock_data(num_examples=4096, data_dir=data_dir,
                              **kwargs):
    yield


def measure_one(name: str, steps: int, overrides=()) -> dict:
  """Trains config `name` for `steps` steps in this process; its figures."""
  sys.path.insert(0, REPO)
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    from dist_keras import api, strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  from dist_keras import configs  # pylint: disable=g-import-not-at-top
  c = configs.load(name, overrides)
  c.train.steps, c.train.log_every = steps, max(1, steps // 6)
  c.eval.every, c.eval.steps = 0, 1
  c.log.calibration_steps, c.log.progress = 0, False
  if c.model.name == "resnet50":
    # 1024 x 224^2 images take minutes per step on a CPU; the pipeline's
    # share is measured at a batch this machine can step through.
    c.train.global_batch_size = RESNET_BATCH
  strategy = strategy_lib.get_strategy(c.runtime)
  with tempfile.TemporaryDirectory() as tmp, _mock_tfds(c, tmp):
    summary = api.fit(c.model.name, c.data.name,
                      workdir=os.path.join(tmp, "run"), config=c,
                      strategy=strategy).summary
  out = {k: summary[k] for k in ("input_wait_ms", "step_ms",
                                 "examples_per_sec")}
  out["wall_step_ms"] = 1e3 * c.train.global_batch_size / out[
      "examples_per_sec"]
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--override", action="append", default=[],
                 help="section.key=value, e.g. data.pipeline_per_replica=True")
  p.add_argument("--one", help=argparse.SUPPRESS)  # The child process.
  args = p.parse_args()
  if args.one:
    print(json.dumps(measure_one(args.one, args.steps, args.override)))
    return
  # "step": the in-graph step (sync/step_ms, what sync/fraction divides by);
  # "wall": wall-clock time per step (perf/step_ms), host overhead included.
  print(f"{'config':24} {'input wait ms':>14} {'step ms':>9} {'share':>7} "
        f"{'wall ms':>9} {'share':>7}")
  sys.path.insert(0, REPO)
  from dist_keras import configs  # pylint: disable=g-import-not-at-top
  for name in (args.configs.split(",") if args.configs else configs.names()):
    steps = min(args.steps, 8) if "resnet" in name else args.steps
    result = subprocess.run(
        [sys.executable, __file__, f"--one={name}", f"--steps={steps}",
         *[f"--override={o}" for o in args.override]],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if result.returncode:
      print(f"{name:24} failed: {result.stderr.strip().splitlines()[-1]}")
      continue
    r = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{name:24} {r['input_wait_ms']:14.2f} {r['step_ms']:9.1f} "
          f"{100 * r['input_wait_ms'] / r['step_ms']:6.1f}% "
          f"{r['wall_step_ms']:9.1f} "
          f"{100 * r['input_wait_ms'] / r['wall_step_ms']:6.1f}%"
          + (f"  ({steps} steps, global batch {RESNET_BATCH})"
             if "resnet" in name else ""), flush=True)


if __name__ == "__main__":
  main()
