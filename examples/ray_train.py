"""Your own Keras model trained on a Ray cluster: `dist_keras.fit` is Ray
Train's train_loop_per_worker, unchanged.

Ray's TensorflowTrainer starts the workers and writes each one's TF_CONFIG;
dist_keras then trains with MultiWorkerMirroredStrategy and reports to Ray
at every checkpoint and eval (train_loss, examples_per_sec, ...; eval_* at
each eval), with the checkpoint. A worker that dies makes Ray restart the group
(--max_failures), and the rerun resumes from the workdir's last checkpoint.
The workdir and --storage must be folders every worker sees (shared disk,
or gs:// for the workdir). Needs `pip install -e ".[cpu,ray]"` in the
repository's root (PyPI's "dist-keras" is another project). A bad argument
is refused here, in the driver, before Ray starts: Ray would retry a worker
group that failed on it (--max_failures) as if a worker had died.

  python examples/ray_train.py --workdir=/shared/runs/ray --storage=/shared/ray
      [--workers=2] [--steps=400] [--max_failures=2] [--address=auto]

A two-layer classifier learns whether a point of the square lies inside a
circle (39% of them do); the data is made here, nothing is downloaded.
"""
import argparse
import os
import sys

import dist_keras
from dist_keras import configs, errors, validate
import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 64


def examples(split: str):
  """(points [n, 2] in the square [-1, 1]^2, inside the circle? [n, 1])."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.uniform(-1, 1, (4096 if split == "train" else 1024, 2))
  inside = (x ** 2).sum(axis=1, keepdims=True) < 0.5
  return x.astype("float32"), inside.astype("float32")


def model_fn() -> keras.Model:
  """Builds and compiles the model (dist_keras calls it in the scope)."""
  model = keras.Sequential([keras.Input((2,)),
                            keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")])
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss="binary_crossentropy", metrics=["accuracy"])
  return model


def dataset_fn(split: str, input_context: tf.distribute.InputContext):
  """This worker's share of `split`, in per-replica batches."""
  ds = tf.data.Dataset.from_tensor_slices(examples(split)).shard(
      input_context.num_input_pipelines, input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":  # Seeded: a resumed run reads the same stream.
    return ds.shuffle(4096, seed=0).repeat().batch(batch, drop_remainder=True)
  return ds.batch(batch)


def fit_config(steps: int) -> dict:
  """dist_keras.fit's config: the driver checks it, the workers train on
  it."""
  return {"train.global_batch_size": GLOBAL_BATCH, "train.steps": steps,
          "train.log_every": 50, "train.checkpoint_every": 100,
          "eval.every": 200}


def train_loop_per_worker(loop_config: dict) -> None:
  """What each Ray worker runs: dist_keras.fit, nothing else (Keras
  callbacks, if any, come in the loop's config)."""
  dist_keras.fit(model_fn, dataset_fn, workdir=loop_config["workdir"],
                 config=fit_config(loop_config["steps"]),
                 callbacks=loop_config.get("callbacks"))


def check(workdir: str, workers: int, steps: int) -> None:
  """Raises dist_keras.UserError for a bad argument, as dist_keras.fit and
  `python -m dist_keras.train` would (dist_keras.validate), in the driver."""
  if workers < 1:
    raise dist_keras.UserError(
        f"--workers={workers} must be >= 1 (with 0, Ray runs the loop in "
        "this driver, not as a cluster, and keeps no checkpoint).")
  if not workdir:
    raise dist_keras.UserError("--workdir= names no folder (an unset "
                               "variable?); pass the run's folder, which "
                               "every worker sees.")
  validate.workdir(workdir)
  validate.config(configs.resolve(fit_config(steps)))


def trainer(workdir: str, storage: str, workers: int, steps: int,
            max_failures: int, callbacks=None):
  """Ray's TensorflowTrainer of `workers` CPU workers over train_loop."""
  from ray import train  # pylint: disable=import-outside-toplevel
  from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=import-outside-toplevel
  return TensorflowTrainer(
      train_loop_per_worker,
      train_loop_config={"workdir": os.path.abspath(workdir), "steps": steps,
                         "callbacks": callbacks},
      scaling_config=train.ScalingConfig(num_workers=workers),
      run_config=train.RunConfig(
          name=os.path.basename(os.path.abspath(workdir)),
          storage_path=os.path.abspath(storage),
          failure_config=train.FailureConfig(max_failures=max_failures)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/ray_train")
  parser.add_argument("--storage", default="runs/ray_storage")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--max_failures", type=int, default=2)
  parser.add_argument("--address", default=None,
                      help="a running cluster (auto); default: a local one")
  args = parser.parse_args()
  try:
    check(args.workdir, args.workers, args.steps)
  except dist_keras.UserError as e:
    print(f"ray_train.py: error: {e}", file=sys.stderr)
    sys.exit(errors.EXIT_CONFIG_ERROR)
  import ray  # pylint: disable=import-outside-toplevel
  ray.init(address=args.address,
           num_cpus=None if args.address else args.workers)
  result = trainer(args.workdir, args.storage, args.workers, args.steps,
                   args.max_failures).fit()
  print(f"Ray saw: step {result.metrics['step']:.0f}, train_loss "
        f"{result.metrics['train_loss']:.3f}, eval_accuracy "
        f"{result.metrics['eval_accuracy']:.3f} (always 'outside': 0.61); "
        f"checkpoint {result.checkpoint.path}")


if __name__ == "__main__":
  main()
