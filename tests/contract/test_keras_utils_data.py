"""Datasets keras.utils makes, as keras.io's examples feed them to fit:
timeseries_dataset_from_array's windows, whose length its element spec
leaves open (x float32[b,?,F]), train under dist_keras as fit trains them,
on one device and two replicas, and their eval counts every window."""
import keras
import numpy as np
import tensorflow as tf

import dist_keras

GLOBAL, STEPS, FEATURES, LENGTH = 16, 5, 3, 6
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": STEPS,
          "train.log_every": STEPS, "eval.every": STEPS,
          "log.calibration_steps": 0,
          "log.progress": False, "log.tensorboard": False}


def _series(split):
  """(features, targets) of a series; 'eval' ends in a partial batch."""
  rows = {"train": 120, "eval": 60}[split]
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.normal(size=(rows, FEATURES)).astype("float32")
  return x, x[LENGTH:, :1].sum(axis=1, keepdims=True)


def _windows(split, batch_size):
  """keras.io's timeseries_weather_forecasting's windows."""
  x, y = _series(split)
  return keras.utils.timeseries_dataset_from_array(
      x[:-LENGTH], y, sequence_length=LENGTH, batch_size=batch_size)


def dataset_fn(split, ctx):
  """The windows re-batched whole, each pipeline's share, the train
  split's repeated (docs/datasets.md)."""
  b = ctx.get_per_replica_batch_size(GLOBAL)
  ds = _windows(split, b).unbatch().shard(ctx.num_input_pipelines,
                                          ctx.input_pipeline_id)
  if split == "eval":
    return ds.batch(b)
  return ds.repeat().batch(b, drop_remainder=True)


def model_fn():
  keras.utils.set_random_seed(0)
  inputs = keras.Input(shape=(LENGTH, FEATURES))
  outputs = keras.layers.Dense(1)(keras.layers.LSTM(4)(inputs))
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  return model


def test_windows_of_open_length_train_as_keras_fit_trains_them(tmp_path,
                                                                mirrored):
  """The windows' length is open in their spec (fit reads it from the
  batches); the model's Input states it: dist_keras' probe built its zero
  batch 1 long and refused the run ("expected shape=(None, 6, 3), found
  shape=(1, 1, 3)"). Now one device = fit bitwise, 2 replicas = one device,
  and the eval's loss = evaluate()'s over every window."""
  spec = dataset_fn("train", tf.distribute.InputContext()).element_spec
  assert spec[0].shape.as_list() == [GLOBAL, None, FEATURES]
  model = model_fn()
  model.fit(dataset_fn("train", tf.distribute.InputContext()),
            steps_per_epoch=STEPS, epochs=1, verbose=0)
  want = model.evaluate(_windows("eval", GLOBAL), verbose=0)
  config = {**CONFIG, "runtime.strategy": "one_device"}
  one = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path / "one"),
                       config=config)
  two = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path / "two"),
                       config=CONFIG, strategy=mirrored)
  for fit_w, one_w, two_w in zip(model.get_weights(), one.model.get_weights(),
                                 two.model.get_weights()):
    np.testing.assert_array_equal(one_w, fit_w)
    np.testing.assert_allclose(two_w, one_w, rtol=0, atol=1e-5)
  assert one.summary["eval_examples"] == two.summary["eval_examples"] == 49
  np.testing.assert_allclose(one.summary["eval_loss"], want, rtol=1e-6)
  np.testing.assert_allclose(two.summary["eval_loss"], want, rtol=1e-5)
