"""Batches users' pipelines yield that Keras' fit takes or refuses, through
dist_keras' checks: x-only and (x, None) batches a model's own steps read
(trained as fit trains them), batches of a size or rank tf.data cannot
state (refused with the fix that states it), a dict of features with one
the model has no Input for (refused where fit fails or misplaces it)."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
from dist_keras.contract import batches
from dist_keras.errors import UserError

GLOBAL, STEPS, FEATURES = 32, 6, 8
SIZES = {"train": 320, "eval": 100}  # 100: a partial last batch.
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": STEPS,
          "train.log_every": STEPS, "eval.every": 3,
          "log.calibration_steps": 0, "log.progress": False,
          "log.tensorboard": False}


def _x(split):
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  z = rng.normal(size=(SIZES[split], 2))
  return (z @ rng.normal(size=(2, FEATURES))).astype("float32")


def _x_only(mode):
  """An autoencoder's data: x alone, or (x, None) (`mode` "xnone")."""

  def dataset_fn(split, ctx):
    ds = tf.data.Dataset.from_tensor_slices(_x(split))
    if mode == "xnone":
      ds = ds.map(lambda x: (x, None))
    b = ctx.get_per_replica_batch_size(GLOBAL)
    if split == "train":
      return ds.repeat().batch(b, drop_remainder=True)
    return ds.batch(b)

  return dataset_fn


class AutoEncoder(keras.Model):
  """Its own steps compare the prediction with x: through the compiled
  loss, or by hand (a compile of metrics only), and the compiled
  metrics."""

  def __init__(self):
    super().__init__()
    self.enc = keras.layers.Dense(3, activation="tanh")
    self.dec = keras.layers.Dense(FEATURES)

  def call(self, x):
    return self.dec(self.enc(x))

  def train_step(self, data):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      if self.loss is not None:
        loss = self.compute_loss(x=x, y=x, y_pred=y_pred)
      else:  # A mean over the global batch, as Keras scales its own.
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        loss = tf.reduce_mean(tf.square(y_pred - x)) / replicas
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return self.compute_metrics(x, x, y_pred)

  def test_step(self, data):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = self(x, training=False)
    if self.loss is not None:
      self.compute_loss(x=x, y=x, y_pred=y_pred)
    return self.compute_metrics(x, x, y_pred)


def _autoencoder(compiled, own_test_step=True):
  def model_fn():
    keras.utils.set_random_seed(0)
    model = AutoEncoder() if own_test_step else _KerasTestStep()
    model(tf.zeros((1, FEATURES)))
    loss = {"loss": "mse"} if compiled == "loss" else {}
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["mae"],
                  **loss)
    model.optimizer.build(model.trainable_variables)
    return model
  return model_fn


class _KerasTestStep(AutoEncoder):
  test_step = keras.Model.test_step


@pytest.mark.parametrize("compiled", ["loss", "metrics"])
@pytest.mark.parametrize("mode,replicas", [("x", 2), ("xnone", 2),
                                           ("xnone", 1)])
def test_batches_without_labels_train_an_own_step_as_keras_fit_does(
    tmp_path, mirrored, compiled, mode, replicas):
  """x-only and (x, None) batches, read by the model's own train_step and
  test_step: the weights and every logged value = Keras' fit on one device
  on the same global batches. They were refused (the compiled loss "needs
  labels"; the metrics "cannot take" None), and (x, None) crashed the
  batch check ('NoneTensorSpec' object has no attribute 'shape') and,
  under Mirrored, TensorFlow's partial eval batches."""
  model_fn, dataset_fn = _autoencoder(compiled), _x_only(mode)
  reference = model_fn()
  one = tf.distribute.InputContext()
  fitted = reference.fit(
      dataset_fn("train", one), epochs=2, steps_per_epoch=STEPS // 2,
      validation_data=dataset_fn("eval", one), verbose=0,
      shuffle=False).history
  result = dist_keras.fit(
      model_fn, dataset_fn, workdir=str(tmp_path / "run"), config=CONFIG,
      strategy=mirrored if replicas == 2 else "one_device")
  assert set(result.history) == set(fitted)
  for name, values in fitted.items():
    np.testing.assert_allclose(result.history[name], values, rtol=1e-5,
                               atol=1e-7, err_msg=name)
  for ours, theirs in zip(result.model.weights, reference.weights):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-6)
  assert result.summary["eval_examples"] == SIZES["eval"]


def test_batches_without_labels_for_keras_test_step_are_refused(tmp_path,
                                                                mirrored):
  """An own train_step takes x-only batches, but Keras' test_step needs
  labels for the compiled loss (its evaluate fails on them): refused at
  the eval split, before anything is written."""
  with pytest.raises(UserError) as e:
    dist_keras.fit(_autoencoder("loss", own_test_step=False),
                   _x_only("x"), workdir=str(tmp_path / "run"),
                   config=CONFIG, strategy=mirrored)
  assert str(e.value).startswith(
      "dataset_fn('eval', ...) yields batches without labels (x "), str(
          e.value)
  assert "), but the compiled loss 'mse' needs them" in str(e.value)
  assert not (tmp_path / "run").exists()


def _buckets(split, ctx):
  """Whole batches of sequences bucketed by length: their size, 16, is
  not static (bucket_by_sequence_length, drop_remainder=True)."""
  seqs = [[1 + i % 9] * (1 + i % 25) for i in range(64)]
  ds = tf.data.Dataset.from_generator(
      lambda: iter(zip(seqs, [1.0] * 64)), output_signature=(
          tf.TensorSpec((None,), tf.int32), tf.TensorSpec((), tf.float32)))
  b = ctx.get_per_replica_batch_size(GLOBAL)
  return ds.repeat().bucket_by_sequence_length(
      lambda x, y: tf.shape(x)[0], [10], [b, b], drop_remainder=True)


def test_batches_of_unknown_size_are_told_the_fix_that_states_it():
  """drop_remainder=True, which the run asked for, cannot state the size
  of bucketed batches: the line names tf.ensure_shape, and its map, run
  as written, makes batches the check takes."""
  ctx = tf.distribute.InputContext(num_replicas_in_sync=2)
  with pytest.raises(UserError) as e:
    batches.check_dataset(_buckets("train", ctx), "train", GLOBAL, 2)
  message = str(e.value)
  assert message.startswith(
      "dataset_fn('train', ...) yields batches of unknown size "
      "(x int32[?,?], y float32[?])"), message
  fix = re.search(r"state it: (ds\.map\(.*\))\.$", message).group(1)
  fixed = eval(fix, {"tf": tf, "ds": _buckets("train", ctx)})  # pylint: disable=eval-used
  batches.check_dataset(fixed, "train", GLOBAL, 2)
  assert fixed.element_spec[0].shape.as_list() == [16, None]



def _text_mapped_after_batch(split, ctx):
  """keras.io's text_classification_from_scratch: TextVectorization in a
  map after batch(drop_remainder=True) loses x's batch size; y keeps it."""
  words = keras.layers.TextVectorization(max_tokens=20,
                                         output_sequence_length=5)
  words.adapt(["a b c", "d e"])
  ds = tf.data.Dataset.from_tensor_slices((["a b", "c d e"] * 32,
                                           [0, 1] * 32))
  ds = ds.repeat().batch(ctx.get_per_replica_batch_size(GLOBAL),
                         drop_remainder=True)
  return ds.map(lambda x, y: (words(tf.expand_dims(x, -1)), y))


def test_a_batch_size_a_map_loses_is_told_to_be_stated():
  """The line said 'batch with drop_remainder=True', which the pipeline
  did: a map after batch() lost the size. Its fix, run as written, makes
  batches the check takes."""
  ctx = tf.distribute.InputContext(num_replicas_in_sync=2)
  with pytest.raises(UserError) as e:
    batches.check_dataset(_text_mapped_after_batch("train", ctx), "train",
                          GLOBAL, 2)
  message = str(e.value)
  assert message.startswith(
      "dataset_fn('train', ...) yields batches of unknown size in part (x "
      "int64[?,5], y int32[16]): a function mapped after batch() "
      "(TextVectorization does) lost the batch dimension of what the "
      "others keep at 16; state it at the end of the map, or map it again: "
      "ds.map("), message
  assert "drop_remainder" not in message
  fix = re.search(r"map it again: (ds\.map\(.*\))\.$", message).group(1)
  fixed = eval(fix, {"tf": tf, "ds": _text_mapped_after_batch("train", ctx)})  # pylint: disable=eval-used
  batches.check_dataset(fixed, "train", GLOBAL, 2)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_batches_of_unknown_rank_are_one_line(split):
  """A tf.py_function after batch() (Keras' fit fails on its batches
  too): the line names the shapes to set; it was a ValueError ("Cannot
  iterate over a shape with unknown rank") from writing that line."""
  ds = tf.data.Dataset.from_tensor_slices(
      (np.ones((64, 4), "float32"), np.ones((64, 1), "float32")))
  ds = ds.repeat().batch(16, drop_remainder=True) if split == "train" else (
      ds.batch(16))
  ds = ds.map(lambda x, y: tuple(tf.py_function(
      lambda u, v: (u * 2, v), [x, y], [tf.float32, tf.float32])))
  with pytest.raises(UserError) as e:
    batches.check_dataset(ds, split, GLOBAL, 2)
  assert str(e.value).startswith(
      f"dataset_fn('{split}', ...) yields batches of unknown rank (x "
      "float32[unknown rank], y float32[unknown rank]), as a tf.py_function"
      ), str(e.value)
  assert "tf.ensure_shape(t, [batch, ...])" in str(e.value)


def _dict_model_fn():
  a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
  model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(
      keras.layers.Concatenate()([a, b])), name="features")
  model.compile(optimizer="sgd", loss="mse")
  return model


def _features_with(key):
  def dataset_fn(split, ctx):
    x = {"a": np.ones((64, 3), "float32"), "b": np.ones((64, 2), "float32"),
         key: np.arange(64)}
    ds = tf.data.Dataset.from_tensor_slices((x, np.ones((64, 1), "float32")))
    b = ctx.get_per_replica_batch_size(GLOBAL)
    if split == "train":
      return ds.repeat().batch(b, drop_remainder=True)
    return ds.batch(b)
  return dataset_fn


@pytest.mark.parametrize("key,place", [("a_id", "b"), ("0id", "a")])
def test_a_feature_that_would_take_an_inputs_place_is_refused(
    tmp_path, mirrored, key, place):
  """Keras hands a dict of features to a dict of Inputs in sorted order:
  a feature without an Input that sorts before an Input's name takes its
  place, and fit fails at its first step ("Invalid input shape"), as the
  run did, after writing its workdir. Refused before, naming both."""
  one = tf.distribute.InputContext()
  with pytest.raises(ValueError, match="Invalid input shape"):
    _dict_model_fn().fit(_features_with(key)("train", one),
                         steps_per_epoch=1, verbose=0,
                         shuffle=False)
  with pytest.raises(UserError) as e:
    dist_keras.fit(_dict_model_fn, _features_with(key),
                   workdir=str(tmp_path / "run"), config=CONFIG,
                   strategy=mirrored)
  message = str(e.value)
  assert message.startswith(
      f"dataset_fn('train', ...) yields the feature '{key}', which model "
      f"'features' has no Input for (its Inputs: a, b)"), message
  assert f"it would take the place of Input '{place}'" in message
  assert "({k: x[k] for k in ('a', 'b')}, *rest)" in message
  assert not (tmp_path / "run").exists()


def test_a_feature_sorting_after_the_inputs_is_left_out_as_fit_does(
    tmp_path, mirrored):
  """One that sorts after every Input's name is left out by Keras (with
  its warning): trained, as under fit."""
  result = dist_keras.fit(_dict_model_fn, _features_with("z_id"),
                          workdir=str(tmp_path / "run"), config=CONFIG,
                          strategy=mirrored)
  assert result.summary["steps"] == STEPS
