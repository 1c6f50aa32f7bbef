"""A user's binary classifier and its data: the module a config names.

binary_config.py points dist_keras at these two functions by import path
(model.name = "binary_task:model_fn", data.name = "binary_task:dataset_fn"),
so `python -m dist_keras.train` on every worker of a cluster loads them
itself: no driver script. Nothing here imports dist_keras.
"""
import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 128  # binary_config.py sets train.global_batch_size to this.
FEATURES = 10


def examples(split: str):
  """(features [n, 10], label [n, 1]): a noisy nonlinear rule."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  n = 16384 if split == "train" else 2000
  x = rng.normal(size=(n, FEATURES)).astype("float32")
  score = x @ np.linspace(-1.0, 1.0, FEATURES) + x[:, 0] * x[:, 1]
  flipped = rng.uniform(size=n) < 0.05  # 5% label noise: ~95% at best.
  label = (score > 0) ^ flipped
  return x, label.astype("float32")[:, None]


def model_fn() -> keras.Model:
  """A small MLP with dropout, compiled as for Keras' fit."""
  inputs = keras.Input((FEATURES,), name="features")
  x = keras.layers.Dense(64, activation="relu",
                         kernel_regularizer=keras.regularizers.L2(1e-4))(
                             inputs)
  x = keras.layers.Dropout(0.1)(x)
  x = keras.layers.Dense(64, activation="relu")(x)
  logits = keras.layers.Dense(1, name="logit")(x)
  model = keras.Model(inputs, logits, name="binary_classifier")
  model.compile(
      optimizer=keras.optimizers.Adam(1e-3),
      loss=keras.losses.BinaryCrossentropy(from_logits=True),
      metrics=[keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0),
               keras.metrics.AUC(name="auc", from_logits=True)])
  return model


def dataset_fn(split: str, input_context: tf.distribute.InputContext):
  """This worker's shard of `split`, in per-replica batches."""
  x, y = examples(split)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
      input_context.num_input_pipelines, input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    ds = ds.shuffle(len(x), seed=0).repeat().batch(batch, drop_remainder=True)
  else:
    ds = ds.batch(batch)
  return ds.prefetch(tf.data.AUTOTUNE)
