"""Keras' fit(class_weight=...) under dist_keras: dist_keras.fit takes it
(as train.class_weight), weighs the train batches by their labels' classes
as fit does (one device = fit bitwise, 2 replicas = one device) and leaves
the eval unweighed, as fit's validation_data; labels of every form fit
reads (int, uint8 (N, 1), one-hot, 0/1 floats) weigh as Keras weighs them;
what fit refuses is refused in one line."""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters import tf_dataset_adapter

import dist_keras
from dist_keras.contract import class_weights
from dist_keras.errors import UserError

GLOBAL, STEPS, FEATURES = 32, 6, 5
WEIGHTS = {0: 0.25, 1: 30.0}  # keras.io's imbalanced_classification's kind.
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": STEPS,
          "train.log_every": STEPS, "eval.every": STEPS,
          "log.calibration_steps": 0, "log.progress": False,
          "log.tensorboard": False}


def _examples(split):
  """Features and uint8 (N, 1) labels, 1 rare (as the example's)."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.normal(size=({"train": 256, "eval": 70}[split], FEATURES))
  y = (x[:, :1] + 0.3 * rng.normal(size=(len(x), 1)) > 1.2).astype("uint8")
  return x.astype("float32"), y


def dataset_fn(split, ctx):
  ds = tf.data.Dataset.from_tensor_slices(_examples(split))
  b = ctx.get_per_replica_batch_size(GLOBAL)
  if split == "eval":
    return ds.batch(b)
  ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
  return ds.repeat().batch(b, drop_remainder=True)


def model_fn():
  keras.utils.set_random_seed(0)
  inputs = keras.Input((FEATURES,))
  model = keras.Model(inputs, keras.layers.Dense(1, "sigmoid")(
      keras.layers.Dense(8, "relu")(inputs)))
  model.compile(optimizer=keras.optimizers.SGD(0.05),
                loss="binary_crossentropy")
  return model


def test_class_weight_trains_as_keras_fit_trains_it(tmp_path, mirrored):
  """dist_keras.fit refused class_weight= ("takes no class_weight="), and
  the docs' recipe failed on these uint8 (N, 1) labels. Now the weights
  are fit's, bitwise on one device, and 2 replicas = one device; the eval
  loss is evaluate()'s, unweighed."""
  model = model_fn()
  model.fit(dataset_fn("train", tf.distribute.InputContext()),
            steps_per_epoch=STEPS, epochs=1, verbose=0,
            class_weight=WEIGHTS)
  want = model.evaluate(dataset_fn("eval", tf.distribute.InputContext()),
                        verbose=0)
  unweighed = model_fn()
  unweighed.fit(dataset_fn("train", tf.distribute.InputContext()),
                steps_per_epoch=STEPS, epochs=1, verbose=0)
  one = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path / "one"),
                       config={**CONFIG, "runtime.strategy": "one_device"},
                       class_weight=WEIGHTS)
  two = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path / "two"),
                       config=CONFIG, strategy=mirrored, class_weight=WEIGHTS)
  with open(tmp_path / "one" / "config.json", encoding="utf-8") as f:
    assert json.load(f)["train"]["class_weight"] == [0.25, 30.0]
  assert np.abs(model.get_weights()[0]
                - unweighed.get_weights()[0]).max() > 1e-3
  for fit_w, one_w, two_w in zip(model.get_weights(), one.model.get_weights(),
                                 two.model.get_weights()):
    np.testing.assert_array_equal(one_w, fit_w)
    np.testing.assert_allclose(two_w, one_w, rtol=0, atol=1e-5)
  np.testing.assert_allclose(one.summary["eval_loss"], want, rtol=1e-6)
  np.testing.assert_allclose(two.summary["eval_loss"], want, rtol=1e-5)


@pytest.mark.parametrize("y", [
    np.array([0, 2, 1, 2], "int64"), np.array([[0], [2], [1], [1]], "uint8"),
    np.eye(3, dtype="float32")[[2, 0, 1, 2]],
    np.array([[0.0], [1.0], [1.0], [0.0]], "float32")])
def test_every_label_form_weighs_as_keras_weighs_it(y):
  """int, uint8 (N, 1), one-hot and 0/1 float labels: the sample weights
  Keras' own map function gives, a class left out of the dict weighing 1."""
  given = {0: 0.5, 2: 4}
  ds = tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), y)).batch(4)
  ours = class_weights.weighed(ds, class_weights.as_weights(given))
  keras_own = ds.map(tf_dataset_adapter.make_class_weight_map_fn(given))
  (_, _, got), = ours
  (_, _, want), = keras_own
  assert got.dtype == want.dtype
  np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("y", [
    np.array([0, 3, 1, -1], "int64"), np.eye(4, dtype="float32")[[0, 3, 1]]])
def test_a_label_past_the_last_class_given_weighs_one(y):
  """{0: .5, 1: 2} and labels 3 or -1: weight 1, as for a class the dict
  leaves out (Keras 3.16's fit, keras#23073; 3.15's failed in its gather,
  as dist_keras did: 'a value the model cannot take')."""
  ds = tf.data.Dataset.from_tensor_slices((np.zeros((len(y), 2)), y))
  weighed = class_weights.weighed(ds.batch(4), (0.5, 2.0))
  (_, _, got), = weighed
  np.testing.assert_array_equal(got.numpy(), [0.5, 1.0, 2.0, 1.0][:len(y)])


def _weighted(split, ctx):
  return dataset_fn(split, ctx).map(lambda x, y: (x, y, tf.ones([GLOBAL])))


@pytest.mark.parametrize("fn,given,config,said", [
    (dataset_fn, {"0": 1.0}, CONFIG, r"class_weight=\{'0': 1.0\} is not a"),
    (dataset_fn, {0: -1.0}, CONFIG, r"class_weight=\(-1.0,\) holds -1.0"),
    (dataset_fn, WEIGHTS, {**CONFIG, "train.class_weight": (1.0,)},
     "got class_weight= and config"),
    (_weighted, WEIGHTS, CONFIG, "yields sample weights too")])
def test_what_fit_refuses_is_one_line(tmp_path, fn, given, config, said):
  with pytest.raises(UserError, match=said):
    dist_keras.fit(model_fn, fn, workdir=str(tmp_path / "w"),
                   config={**config, "runtime.strategy": "one_device"},
                   class_weight=given)
