"""A user's own models and data, written as a Keras user writes them.

Tests train them through `dist_keras.fit` and through the command line
(`--config.model.name=user_task:model_fn`, with tests/ on PYTHONPATH), and
compare replica and worker counts on them. Nothing here imports dist_keras.
"""
import json
import os
import threading
import time

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 48  # Splits evenly over 1, 2, 3 and 4 replicas.
FEATURES = 6
SIZES = {"train": 512, "eval": 123}  # 123: no batch or replica count divides it.
CLASSES = 3


def _examples(split: str):
  """(x, y, sample_weight) arrays of `split`: y is a noisy linear function
  of x; the weights (1, 2, 3, 1, ...) make an unweighted loss differ."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  n = SIZES[split]
  x = rng.normal(size=(n, FEATURES)).astype("float32")
  y = x @ np.linspace(-1.0, 1.0, FEATURES) + 0.1 * rng.normal(size=n)
  weights = 1.0 + np.arange(n) % 3
  return x, y.astype("float32")[:, None], weights.astype("float32")


def _pipeline(split, input_context, labels):
  """This pipeline's shard of `split`, batched per replica."""
  x, y, weights = _examples(split)
  ds = tf.data.Dataset.from_tensor_slices((x, labels(y), weights))
  ds = ds.shard(input_context.num_input_pipelines,
                input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    # Seeded: the stream is the same on every run, so a resume is exact.
    return ds.shuffle(SIZES["train"], seed=0).repeat().batch(
        batch, drop_remainder=True)
  return ds.batch(batch)  # Finite; the last batch partial.


def dataset_fn(split, input_context):
  """Regression: (x, y, sample_weight)."""
  return _pipeline(split, input_context, lambda y: y)


def unsharded_dataset_fn(split, input_context):
  """dataset_fn as a user of Keras' fit (which shards for them) writes it:
  no ds.shard, so every input pipeline reads the same stream."""
  x, y, weights = _examples(split)
  ds = tf.data.Dataset.from_tensor_slices((x, y, weights))
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    return ds.shuffle(SIZES["train"], seed=0).repeat().batch(
        batch, drop_remainder=True)
  return ds.batch(batch)


# The train pipeline of slow_closing_dataset_fn: destroying its iterator
# takes CLOSE_SECONDS, as destroying an autotuned one waits for tf.data's
# autotune thread (0-60 s, at random).
CLOSE_SECONDS = 10.0
closing = threading.Event()  # Set as a destruction begins.
closed_at = []  # time.monotonic() as each destruction ended.


def slow_closing_dataset_fn(split, input_context):
  """dataset_fn's splits; its train stream from a generator whose end (as
  its iterator is destroyed) takes CLOSE_SECONDS."""
  if split != "train":
    return dataset_fn(split, input_context)
  x, y, weights = _examples(split)

  def examples():
    try:
      for i in range(10**9):
        n = i % SIZES["train"]
        yield x[n], y[n], weights[n]
    finally:  # (On a thread of TensorFlow's, the destroying one waiting.)
      closing.set()
      time.sleep(CLOSE_SECONDS)
      closed_at.append(time.monotonic())

  ds = tf.data.Dataset.from_generator(examples, output_signature=(
      tf.TensorSpec([FEATURES], tf.float32), tf.TensorSpec([1], tf.float32),
      tf.TensorSpec([], tf.float32)))
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def binary_dataset_fn(split, input_context):
  """Binary labels: is y positive?"""
  return _pipeline(split, input_context,
                   lambda y: (y > 0).astype("float32"))


def onehot_dataset_fn(split, input_context):
  """Three classes of y (below -0.5, between, above 0.5), one-hot."""
  return _pipeline(split, input_context, lambda y: np.eye(CLASSES)[
      np.digitize(y[:, 0], [-0.5, 0.5])].astype("float32"))


def _body(dropout: float):
  inputs = keras.Input((FEATURES,))
  x = keras.layers.Dense(16, activation="tanh",
                         kernel_regularizer=keras.regularizers.L2(1e-3))(
                             inputs)
  return inputs, keras.layers.Dropout(dropout)(x)


def _regressor(dropout: float) -> keras.Model:
  inputs, x = _body(dropout)
  outputs = keras.layers.Dense(
      1, kernel_regularizer=keras.regularizers.L2(1e-3))(x)
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                metrics=["mae"])
  return model


def model_fn():
  """Regression: MSE loss, MAE metric, L2 regularisers, SGD."""
  return _regressor(0.0)


def model_fn_dropout():
  """The same with dropout 0.1 (random state to checkpoint)."""
  return _regressor(0.1)


def unreduced_loss_model_fn():
  """A loss of reduction=None: a loss per example, not one number."""
  inputs = keras.Input((FEATURES,))
  model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
  model.compile(optimizer=keras.optimizers.SGD(0.05),
                loss=keras.losses.MeanSquaredError(reduction=None))
  return model


class Subclassed(keras.Model):
  """A subclassed model: no weights until its first call."""

  def __init__(self):
    super().__init__()
    self.hidden = keras.layers.Dense(16, activation="tanh")
    self.out = keras.layers.Dense(1)

  def call(self, x, training=False):
    return self.out(self.hidden(x))


def subclassed_model_fn():
  model = Subclassed()
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                metrics=["mae"])
  return model


def model_fn_of_its_own_on_worker_1():
  """model_fn, but TF_CONFIG's task 1 builds relu for tanh and clips its
  gradients: the same weights' shapes, another model. (Not another
  learning rate: a variable, whose value MultiWorkerMirroredStrategy
  takes from worker 0's as it is made.)"""
  task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
  if task.get("index") != 1:
    return model_fn()
  inputs = keras.Input((FEATURES,))
  x = keras.layers.Dense(16, activation="relu",
                         kernel_regularizer=keras.regularizers.L2(1e-3))(
                             inputs)
  outputs = keras.layers.Dense(
      1, kernel_regularizer=keras.regularizers.L2(1e-3))(x)
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.SGD(0.05, clipnorm=1.0),
                loss="mse",
                metrics=["mae"])
  return model


def model_fn_wider_on_worker_1():
  """model_fn, but TF_CONFIG's task 1 builds 32 hidden units for 16."""
  task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
  if task.get("index") != 1:
    return model_fn()
  inputs = keras.Input((FEATURES,))
  x = keras.layers.Dense(32, activation="tanh")(inputs)
  model = keras.Model(inputs, keras.layers.Dense(1)(x))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


def binary_model_fn():
  inputs, x = _body(0.0)
  model = keras.Model(inputs, keras.layers.Dense(1)(x))
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy(name="accuracy",
                                                      threshold=0.0),
                         keras.metrics.AUC(name="auc", from_logits=True)])
  return model


def onehot_model_fn():
  inputs, x = _body(0.0)
  model = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
  model.compile(optimizer="adam",
                loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  return model


# --- Variable-length token sequences, padded per batch ----------------------

TOKENS = 20
PADDED_SIZES = {"train": 512, "eval": 200}  # 200: the last batch partial.


def padded_dataset_fn(split, input_context):
  """Sequences of 3 to 8 tokens (x int32[b, None], padded with 0 to each
  batch's longest); y: the first token's class. The batches are sharded,
  so at 2 replicas the last eval step leaves replica 1 none."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  lengths = rng.integers(3, 9, PADDED_SIZES[split])
  sequences = [rng.integers(1, TOKENS, n).astype("int32") for n in lengths]
  labels = np.array([s[0] % CLASSES for s in sequences], "int32")
  ds = tf.data.Dataset.from_generator(
      lambda: iter(zip(sequences, labels)),
      output_signature=(tf.TensorSpec((None,), tf.int32),
                        tf.TensorSpec((), tf.int32)))
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  ds = (ds.repeat().padded_batch(batch, drop_remainder=True)
        if split == "train" else ds.padded_batch(batch))
  return ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)


def padded_model_fn(*front):
  """Embedding(mask_zero) and a GRU: the padding changes nothing. `front`:
  layers applied to the tokens first."""
  inputs = keras.Input((None,), dtype="int32")
  x = inputs
  for layer in front:
    x = layer(x)
  x = keras.layers.Embedding(TOKENS, 8, mask_zero=True)(x)
  outputs = keras.layers.Dense(CLASSES)(keras.layers.GRU(8)(x))
  model = keras.Model(inputs, outputs)
  model.compile(optimizer="adam", metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


# --- What users get wrong (each must be one line, exit 2) -------------------

def uncompiled_model_fn():
  inputs, x = _body(0.0)
  return keras.Model(inputs, keras.layers.Dense(1)(x))


def not_a_model_fn():
  return "model"


def unbatched_dataset_fn(split, input_context):
  return dataset_fn(split, input_context).unbatch()


def undropped_remainder_dataset_fn(split, input_context):
  """Batched without drop_remainder: batches of unknown static size."""
  return dataset_fn(split, input_context).unbatch().batch(24)


def wrong_batch_dataset_fn(split, input_context):
  """Batches of GLOBAL_BATCH per replica: the global batch, not a share."""
  x, y, weights = _examples(split)
  return tf.data.Dataset.from_tensor_slices((x, y, weights)).repeat().batch(
      GLOBAL_BATCH, drop_remainder=True)


def no_labels_dataset_fn(split, input_context):
  return dataset_fn(split, input_context).map(lambda x, y, w: x)


def four_tuple_dataset_fn(split, input_context):
  return dataset_fn(split, input_context).map(lambda x, y, w: (x, y, w, w))


def finite_train_dataset_fn(split, input_context):
  return dataset_fn(split, input_context).take(3)


def not_a_dataset_fn(split, input_context):
  return _examples(split)


def sized_model_fn(size):
  del size
  return model_fn()


def one_argument_dataset_fn(split):
  return dataset_fn(split, tf.distribute.InputContext())


def string_labels_dataset_fn(split, input_context):
  return _pipeline(split, input_context,
                   lambda y: np.where(y > 0, "up", "down"))


def out_of_range_labels_dataset_fn(split, input_context):
  """Labels 0..5 for a model of CLASSES (3) outputs."""
  return _pipeline(split, input_context,
                   lambda y: (np.arange(len(y)) % 6).astype("int32"))


def out_of_range_labels_on_pipeline_1_dataset_fn(split, input_context):
  """Labels 0..2 on input pipeline 0, 0..5 on pipeline 1 (worker 1 of
  two): only that worker's first step meets a bad one."""
  if input_context.input_pipeline_id == 1:
    return out_of_range_labels_dataset_fn(split, input_context)
  return _pipeline(split, input_context,
                   lambda y: (np.arange(len(y)) % CLASSES).astype("int32"))


def raising_on_pipeline_1_dataset_fn(split, input_context):
  """A user's own error on input pipeline 1 (worker 1 of two) only: its
  shard is missing there."""
  if input_context.input_pipeline_id == 1:
    raise RuntimeError("my data shard is missing on this worker")
  return dataset_fn(split, input_context)


def no_eval_on_pipeline_1_dataset_fn(split, input_context):
  """No eval split (None) on input pipeline 1 (worker 1 of two) only."""
  if split == "eval" and input_context.input_pipeline_id == 1:
    return None
  return dataset_fn(split, input_context)


def classes_model_fn():
  inputs, x = _body(0.0)
  model = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
  model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  return model


def empty_eval_dataset_fn(split, input_context):
  """An eval split whose filter keeps nothing (its size is unknown until
  it is read)."""
  ds = dataset_fn(split, input_context)
  return ds if split == "train" else ds.unbatch().filter(
      lambda *_: False).batch(24)


def no_eval_batches_dataset_fn(split, input_context):
  """An eval split that has no batches, as its cardinality says."""
  ds = dataset_fn(split, input_context)
  return ds if split == "train" else ds.take(0)


def unlabelled_eval_dataset_fn(split, input_context):
  """An eval split of x alone."""
  ds = dataset_fn(split, input_context)
  return ds if split == "train" else ds.map(lambda x, *_: x)


def unbatched_eval_dataset_fn(split, input_context):
  """An eval split of single examples, never batched."""
  ds = dataset_fn(split, input_context)
  return ds if split == "train" else ds.unbatch()


NOT_CALLABLE = 3


def dry_on_pipeline_1_dataset_fn(split, input_context):
  """Input pipeline 1's (worker 1 of two) train stream ends after 2
  batches: its step 3 finds none. A filter hides its size (unknown), so no
  check at build sees it; pipeline 0's is repeat()ed (known infinite)."""
  ds = dataset_fn(split, input_context)
  if split == "train" and input_context.input_pipeline_id == 1:
    return ds.take(2).filter(lambda *_: True)
  return ds


def dry_on_pipeline_1_of_unknown_sizes_dataset_fn(split, input_context):
  """The same, every pipeline's train stream of unknown size."""
  ds = dry_on_pipeline_1_dataset_fn(split, input_context)
  return ds.filter(lambda *_: True) if split == "train" else ds
