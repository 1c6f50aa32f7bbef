"""Your own Keras model and tf.data input, trained through `dist_keras.fit`.

A Conv1D + GRU regressor forecasts the next value of a noisy sine wave of
unknown frequency and phase from its last 32 readings. The data is made
here; nothing is downloaded.

  python examples/own_model.py --workdir=runs/own_model [--steps=600]

Everything a built-in config gets, this model gets: the strategy picked for
the machine (here MirroredStrategy over 2 logical CPUs), exact eval, resume
(rerun the same command), the sync breakdown in TensorBoard, MFU.
"""
import argparse

import dist_keras
import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 64
SEQ_LEN = 32


def examples(split: str):
  """(noisy readings [n, 32, 1], the next clean value [n, 1])."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  n = 8192 if split == "train" else 1024
  frequency = rng.uniform(0.05, 0.25, (n, 1))
  phase = rng.uniform(0, 2 * np.pi, (n, 1))
  wave = np.sin(2 * np.pi * frequency * np.arange(SEQ_LEN + 1) + phase)
  noisy = wave[:, :SEQ_LEN] + 0.1 * rng.normal(size=(n, SEQ_LEN))
  return (noisy[..., None].astype("float32"),
          wave[:, SEQ_LEN:].astype("float32"))


def model_fn() -> keras.Model:
  """Builds and compiles the model; dist_keras calls it in the strategy's
  scope, so its variables are mirrored on every replica."""
  inputs = keras.Input((SEQ_LEN, 1), name="readings")
  x = keras.layers.Conv1D(16, 3, padding="causal", activation="relu")(inputs)
  x = keras.layers.GRU(32)(x)
  outputs = keras.layers.Dense(1, name="next_value")(x)
  model = keras.Model(inputs, outputs, name="forecaster")
  model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse",
                metrics=["mae"])
  return model


def dataset_fn(split: str, input_context: tf.distribute.InputContext):
  """This input pipeline's share of `split`, in per-replica batches."""
  x, y = examples(split)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
      input_context.num_input_pipelines, input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":  # Seeded shuffle: a resumed run reads the same stream.
    ds = ds.shuffle(len(x), seed=0).repeat().batch(batch, drop_remainder=True)
  else:  # Finite; every example evaluated once whatever the replica count.
    ds = ds.batch(batch)
  return ds.prefetch(tf.data.AUTOTUNE)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/own_model")
  parser.add_argument("--steps", type=int, default=600)
  args = parser.parse_args()
  result = dist_keras.fit(
      model_fn, dataset_fn, workdir=args.workdir,
      config={"train.global_batch_size": GLOBAL_BATCH,
              "train.steps": args.steps, "train.log_every": 50,
              "eval.every": 200})
  # Always predicting 0 scores E|sin| = 2 / pi.
  print(f"eval MAE {result.summary['eval_mae']:.3f} (predicting 0: 0.64)")


if __name__ == "__main__":
  main()
