"""A stateful RNN (LSTM(stateful=True)): it keeps a state row per example
of the batch it was built for, carried from step to step, and through the
eval, as Keras' fit carries it (fit resets nothing by itself). Built for
each replica's batch it trains as fit; built for the global batch (one
device's habit) at 2 replicas it is refused before anything is written."""
import functools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
from dist_keras.errors import UserError

GLOBAL, STEPS, TIME = 8, 4, 5
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": 2 * STEPS,
          "eval.every": STEPS, "train.log_every": STEPS,
          "log.calibration_steps": 0, "log.tensorboard": False,
          "log.sync_timing": False, "log.progress": False}


def _model_fn(batch=None):
  """Built for `batch`, or for each replica's share of GLOBAL."""
  batch = batch or GLOBAL // tf.distribute.get_strategy().num_replicas_in_sync
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input(batch_shape=(batch, TIME, 2)),
                            keras.layers.LSTM(4, stateful=True, name="lstm"),
                            keras.layers.Dense(1)], name="stateful")
  model.compile(keras.optimizers.Adam(0.01), "mse")
  return model


def _dataset_fn(split, ctx):
  """A step's replica batches are one device's batch, split in rows: each
  replica's state rows are one device's."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.normal(size=(GLOBAL * STEPS, TIME, 2)).astype("float32")
  y = x.sum(axis=(1, 2))[:, None]
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  ds = ds.repeat() if split == "train" else ds
  ds = ds.batch(ctx.get_per_replica_batch_size(GLOBAL), drop_remainder=True)
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


class _ResetEachBatch(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    self.model.get_layer("lstm").reset_state()


@functools.cache
def _fit(reset_each_batch=False):
  """Keras' fit on one device: 2 epochs, an eval between them."""
  callbacks = [_ResetEachBatch()] if reset_each_batch else []
  model = _model_fn()
  one = tf.distribute.InputContext()
  history = model.fit(_dataset_fn("train", one), epochs=2,
                      steps_per_epoch=STEPS, verbose=0, shuffle=False,
                      validation_data=_dataset_fn("eval", one),
                      callbacks=callbacks)
  return model.get_weights(), history.history


def test_a_stateful_rnn_carries_its_state_as_fit_carries_it(
    tmp_path, mirrored):
  """The state carries over steps (reset each batch, fit's losses differ)
  and through the eval (its batches move it on, as under fit)."""
  result = dist_keras.fit(_model_fn, _dataset_fn, workdir=str(tmp_path),
                          config=CONFIG, strategy=mirrored)
  weights, history = _fit()
  _, reset = _fit(reset_each_batch=True)
  assert abs(reset["loss"][0] - history["loss"][0]) > 1e-3
  for key in ("loss", "val_loss"):
    np.testing.assert_allclose(result.history[key], history[key], rtol=1e-5)
  for got, want in zip(result.model.get_weights(), weights):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_stateful_rnn_built_for_the_global_batch_is_refused(
    tmp_path, mirrored):
  """It failed the first step (Keras' "If an RNN is stateful, the batch
  size ..."), leaving config.json and TensorBoard's events behind."""
  with pytest.raises(UserError, match=(
      "^layer 'lstm' of model 'stateful' is a stateful RNN built for "
      r"batches of 8, but each of the 2 replicas gets batches of 4 \("
      r"train.global_batch_size=8 / 2\); build it for the per-replica batch "
      r"in model_fn: keras.Input\(batch_shape=\(global_batch_size // "
      r"tf.distribute.get_strategy\(\).num_replicas_in_sync, ...\)\).$")):
    dist_keras.fit(lambda: _model_fn(GLOBAL), _dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config={**CONFIG, "log.tensorboard": True},
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")
