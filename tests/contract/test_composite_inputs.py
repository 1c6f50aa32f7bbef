"""Batches whose shapes change from step to step (padded or bucketed
sequences, ragged and sparse features) at 2 replicas, against Keras' fit
and evaluate on one device on the same batches."""
import contextlib
import functools
import io
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
from dist_keras.errors import UserError

GLOBAL, STEPS, TOKENS = 8, 12, 12
SIZES = {"train": GLOBAL * STEPS, "eval": 20}  # 20: the last batch partial.
# Multi-step calls after the first log window (steps_per_loop=0: automatic).
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": STEPS,
          "train.log_every": 4, "eval.every": 0, "log.calibration_steps": 0,
          "log.tensorboard": False, "log.progress": True}


def _sequences(split):
  """Token sequences of 1 to 20 tokens: a per-replica batch of 4 pads to
  its own longest, which differs between the replicas at most steps."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  sequences = [rng.integers(1, TOKENS, n).astype("int32")
               for n in rng.integers(1, 21, SIZES[split])]
  labels = np.array([[s[0] / TOKENS] for s in sequences], "float32")
  return sequences, labels


def _padded_dataset_fn(split, ctx, length=None):
  """x int32[b, None], padded per batch (or int32[b, length], fixed); the
  batches sharded, so at 2 replicas a step's two batches are one device's
  batch."""
  sequences, labels = _sequences(split)
  ds = tf.data.Dataset.from_generator(
      lambda: iter(zip(sequences, labels)),
      output_signature=(tf.TensorSpec((None,), tf.int32),
                        tf.TensorSpec((1,), tf.float32)))
  batch = ctx.get_per_replica_batch_size(GLOBAL)
  ds = (ds.repeat() if split == "train" else ds).padded_batch(
      batch, padded_shapes=([length], [1]), drop_remainder=split == "train")
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def _ragged_dataset_fn(split, ctx):
  """The same sequences as ragged features."""
  sequences, labels = _sequences(split)
  ds = tf.data.Dataset.from_tensor_slices(
      (tf.ragged.constant(sequences, dtype=tf.int32), labels))
  batch = ctx.get_per_replica_batch_size(GLOBAL)
  ds = (ds.repeat().ragged_batch(batch, drop_remainder=True)
        if split == "train" else ds.ragged_batch(batch))
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def _sparse_dataset_fn(split, ctx):
  """Bags of words: SparseTensor x float32[b, TOKENS]."""
  sequences, labels = _sequences(split)
  counts = np.stack([np.bincount(s, minlength=TOKENS) for s in sequences])
  ds = tf.data.Dataset.from_tensor_slices(
      (tf.sparse.from_dense(counts.astype("float32")), labels))
  batch = ctx.get_per_replica_batch_size(GLOBAL)
  ds = (ds.repeat().batch(batch, drop_remainder=True)
        if split == "train" else ds.batch(batch))
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def _text_dataset_fn(split, ctx):
  """The same sequences as sentences, x string[4]: a batch of fixed shape,
  whose tokens' count the model's TextVectorization makes."""
  sequences, labels = _sequences(split)
  ds = tf.data.Dataset.from_tensor_slices((_sentences(sequences), labels))
  batch = ctx.get_per_replica_batch_size(GLOBAL)
  ds = (ds.repeat().batch(batch, drop_remainder=True)
        if split == "train" else ds.batch(batch))
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


def fixed_dataset_fn(split, ctx):
  """The same sequences padded to 20 tokens: x int32[4,20], fixed."""
  return _padded_dataset_fn(split, ctx, length=20)


class _Trim(keras.layers.Layer):
  """Cuts a padded batch to its longest sequence: a length made inside."""

  def call(self, x):
    return tf.RaggedTensor.from_tensor(x, padding=0).to_tensor()

  def compute_output_shape(self, input_shape):
    return (input_shape[0], None)


def _sentences(sequences):
  return np.array([" ".join(f"w{t}" for t in s) for s in sequences])


class _Densify(keras.layers.Layer):
  def call(self, x):
    return x.to_tensor() if isinstance(x, tf.RaggedTensor) else x


def _model_fn(kind="padded", recurrent=False, optimizer=None):
  """Embedding(mask_zero) and a masked mean (or a GRU): the padding
  changes nothing; Adam squares each of the Embedding's slices (a sparse
  input's Dense kernel's: one per distinct column of the batch)."""
  keras.utils.set_random_seed(0)
  if kind == "sparse":
    inputs = keras.Input((TOKENS,), sparse=True)
    x = keras.layers.Dense(4, activation="tanh", name="bag")(inputs)
  elif kind.startswith("text"):  # Keras' default, and a length.
    inputs = keras.Input((), dtype="string")
    words = keras.layers.TextVectorization(
        max_tokens=TOKENS + 1,
        output_sequence_length=None if kind == "text" else 8)
    words.adapt(_sentences(_sequences("train")[0]))
    ids = words(inputs)
    if kind == "text_reshaped":  # The refusal's fix: the batch size back.
      ids = keras.layers.Lambda(lambda t: keras.ops.reshape(
          t[0], (keras.ops.shape(t[1])[0], 8)))([ids, inputs])
    x = keras.layers.Embedding(TOKENS + 1, 4, mask_zero=True,
                               name="tokens")(ids)
    x = keras.layers.GlobalAveragePooling1D()(x)
  elif kind == "trimmed":  # Fixed batches, a length the model makes.
    inputs = keras.Input((20,), dtype="int32")
    x = keras.layers.Embedding(TOKENS, 4, mask_zero=True,
                               name="tokens")(_Trim()(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
  else:
    inputs = keras.Input((None,), dtype="int32", ragged=kind == "ragged")
    x = keras.layers.Embedding(TOKENS, 4, mask_zero=True,
                               name="tokens")(_Densify()(inputs))
    x = (keras.layers.GRU(4) if recurrent
         else keras.layers.GlobalAveragePooling1D())(x)
  model = keras.Model(inputs, keras.layers.Dense(1)(x), name="tokens_model")
  model.compile(optimizer=optimizer or keras.optimizers.Adam(0.01),
                loss="mse", metrics=["mae"])
  return model


def _fit_weights(model_fn, dataset_fn):
  """Keras' fit on one device, on the batches 2 replicas share a step."""
  model = model_fn()
  model.fit(dataset_fn("train", tf.distribute.InputContext()), epochs=1,
            steps_per_epoch=STEPS, verbose=0, shuffle=False)
  return model.get_weights()


_DATASET_FNS = {"padded": _padded_dataset_fn, "text": _text_dataset_fn,
                "sparse": _sparse_dataset_fn, "ragged": _ragged_dataset_fn}


@functools.cache
def _fit_weights_of(kind):
  """_fit_weights of _model_fn(kind) (Adam(0.01)): several tests' one."""
  return _fit_weights(lambda: _model_fn(kind), _DATASET_FNS[kind])


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, mirrored):
  """`(kind) -> (dist_keras' run of _model_fn(kind) at 2 replicas on
  CONFIG, what it printed)`, made on first use: the tests of the
  automatic call size, of the timed steps and of adaptive optimizers
  (Adam) read the same run of a kind."""
  folder = tmp_path_factory.mktemp("two_replicas")

  def run(kind):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      result = dist_keras.fit(lambda: _model_fn(kind), _DATASET_FNS[kind],
                              workdir=str(folder / kind), config=CONFIG,
                              strategy=mirrored)
    return result, printed.getvalue()

  return functools.cache(run)


@pytest.mark.parametrize("kind,variable", [("padded", "tokens/embeddings"),
                                           ("sparse", "bag/kernel"),
                                           ("text", "tokens/embeddings")])
def test_slices_of_a_changing_count_train_one_step_a_call_as_fit_trains(
    two_replicas, kind, variable):
  """Each replica's gradient slices, an Embedding's one per padded token
  (a sparse input's Dense kernel's one per column present), change in
  number every step: gathered in a call of several steps they failed the
  call ("Shape mismatch in the collective instance"), a TensorFlow limit.
  The automatic call size runs one step a call, said at the start; the
  weights are fit's. A TextVectorization makes the tokens' count from
  string batches of fixed shape: judged by the batches' shapes, it ran
  several steps a call and failed so."""
  result, printed = two_replicas(kind)
  assert (f"steps per call: 1 (the gradient of {variable} is gathered as "
          "slices whose number changes") in printed
  initial = _model_fn(kind).get_weights()
  for got, want, before in zip(result.model.get_weights(),
                               _fit_weights_of(kind), initial):
    assert np.abs(want - before).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


# RMSprop and Adagrad in the slow set: the column sum after the gather
# (training/allreduce.py, merge_duplicates) comes before any optimizer sees
# the gradient and names none, so sparse-Adam, which squares the slices
# too, fails wherever they would; the clips take their own path
# (training/sparse_grads.py) and stay in CI.
@pytest.mark.parametrize("kind,optimizer", [
    ("sparse", "Adam"),
    pytest.param("sparse", "RMSprop", marks=pytest.mark.slow),
    pytest.param("sparse", "Adagrad", marks=pytest.mark.slow),
    ("sparse", "clipnorm"), ("sparse", "global_clipnorm"),
    ("padded", "Adam")])
def test_gathered_slices_train_under_adaptive_optimizers_as_one_device(
    tmp_path, mirrored, two_replicas, kind, optimizer):
  """A sparse input's Dense kernel gets a slice per distinct column of the
  batch, summed over its examples (tf.nn.embedding_lookup_sparse's
  tf.unique), which Adam, RMSprop and Adagrad square: a column present in
  both replicas' batches was gathered twice, its halves squared apart
  (0.029 from one device after 12 Adam steps; clipped: 0.025 by
  clipnorm, 0.003 by global_clipnorm). Summed by column after the gather,
  the weights are one device's. An Embedding's slices (one per token,
  repeats kept, as one device's) stay as gathered: summed too, its
  weights ended 0.13 from one device's. (Adam, _model_fn's own: 2
  replicas' run is the shared one.)"""
  def model_fn():
    make = {"clipnorm": lambda: keras.optimizers.Adam(0.01, clipnorm=0.05),
            "global_clipnorm": lambda: keras.optimizers.Adam(
                0.01, global_clipnorm=0.05)}.get(
                    optimizer, lambda: getattr(keras.optimizers, optimizer)(
                        0.01))
    return _model_fn(kind, optimizer=make())

  dataset_fn = {"padded": _padded_dataset_fn,
                "sparse": _sparse_dataset_fn}[kind]

  def trained(name, strategy):
    return dist_keras.fit(
        model_fn, dataset_fn, workdir=str(tmp_path / name),
        config={**CONFIG, "log.progress": False}, strategy=strategy
    ).model.get_weights()

  ones = trained("one", tf.distribute.OneDeviceStrategy("/cpu:0"))
  twos = (two_replicas(kind)[0].model.get_weights() if optimizer == "Adam"
          else trained("m2", mirrored))
  for one, two, before in zip(ones, twos, model_fn().get_weights()):
    assert np.abs(one - before).max() > 1e-3
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-6)


@pytest.mark.parametrize("config,setting", [
    ({"train.steps_per_loop": 3}, "train.steps_per_loop=3"),
    ({}, "model 'tokens_model' was compiled with steps_per_execution=2")])
def test_several_steps_a_call_over_slices_of_a_changing_count_are_refused(
    tmp_path, mirrored, config, setting):
  def model_fn():
    model = _model_fn()
    if not config:
      model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    return model

  with pytest.raises(UserError, match=(
      f"^{setting}, but the gradient of tokens/embeddings is gathered as "
      r"slices whose number changes from batch to batch \(x int32\[4,\?\]"
      ".*; (set train.steps_per_loop=1|compile it with steps_per_execution=1)"
      r", or give the batches static shapes")):
    dist_keras.fit(model_fn, _padded_dataset_fn,
                   workdir=str(tmp_path / "w"), config={**CONFIG, **config},
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")


def test_several_steps_a_call_over_a_length_the_model_makes_are_refused(
    tmp_path, mirrored):
  with pytest.raises(UserError, match=(
      "^train.steps_per_loop=3, but the gradient of tokens/embeddings is "
      "gathered as slices whose number changes from batch to batch "
      r"\(a length the model makes from each batch of fixed shape \(x "
      r"string\[4\], y float32\[4,1\]\)\).*; set train.steps_per_loop=1, "
      r"or fix that length in the model \(e.g. TextVectorization\(")):
    dist_keras.fit(lambda: _model_fn("text"), _text_dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config={**CONFIG, "train.steps_per_loop": 3},
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")


def test_a_batch_dimension_a_layer_loses_is_named_with_its_fix(
    tmp_path, mirrored, capsys):
  """TextVectorization(output_sequence_length=8) makes ids of shape
  [None, 8] from string[4]: the refusal said to fix the length with
  output_sequence_length, which was set already."""
  with pytest.raises(UserError) as e:
    dist_keras.fit(lambda: _model_fn("text_fixed"), _text_dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config={**CONFIG, "train.steps_per_loop": 3},
                   strategy=mirrored)
  assert str(e.value) == (
      "train.steps_per_loop=3, but the gradient of tokens/embeddings is "
      "gathered as slices whose number changes from batch to batch (the "
      "ids it looks up are shaped [?,8] for batches of fixed shape (x "
      "string[4], y float32[4,1]): a layer before it loses their batch "
      "dimension, as TextVectorization does), which TensorFlow cannot "
      "gather in a loop of several steps in one call; set "
      "train.steps_per_loop=1, or give the ids the batch's size back after "
      "that layer: keras.layers.Lambda(lambda t: keras.ops.reshape(t[0], "
      "(keras.ops.shape(t[1])[0], 8)))([ids, inputs]).")
  assert not os.path.exists(tmp_path / "w")
  fixed = dist_keras.fit(lambda: _model_fn("text_reshaped"),
                         _text_dataset_fn, workdir=str(tmp_path / "fixed"),
                         config={**CONFIG, "train.steps_per_loop": 3},
                         strategy=mirrored)  # The fix: 3 steps a call train.
  assert fixed.summary["steps"] == STEPS
  assert fixed.summary["chosen"]["largest_call"] == 3


def trimmed_model_fn():
  return _model_fn("trimmed")


def test_a_length_the_model_makes_from_fixed_numbers_is_said_in_one_line(
    tmp_path):
  """Batches of numbers of fixed shape are not traced at the start (a cost
  at every start); a length the model makes from them fails TensorFlow's
  first call of several steps, said as one line naming the setting, exit
  2. (A process of its own: the failed collective stays aborted.)"""
  settings = {**CONFIG, "train.steps_per_loop": 3,
              "model.name": "test_composite_inputs:trimmed_model_fn",
              "data.name": "test_composite_inputs:fixed_dataset_fn"}
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path / 'w'}",
       *[f"--config.{k}={v}" for k, v in settings.items()]],
      env={"PYTHONPATH": os.pathsep.join(
          [helpers.REPO, helpers.TESTS, os.path.dirname(__file__)])})
  assert result.returncode == 2, result.stderr
  assert re.search(
      r"^dist_keras: error: a gradient's slices changed in number between "
      r"the steps of one call .*; set train.steps_per_loop=1, or fix that "
      r"length in the model.$", result.stderr, re.M), result.stderr


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_ragged_and_sparse_features_train_timed_as_fit_trains(
    tmp_path, mirrored, two_replicas, kind):
  """The timed steps (log.sync_timing, on by default) stamp a batch's
  ragged or sparse features by their component tensors (a RaggedTensor
  has no device: the first step failed); the weights are fit's. One step
  a call: the sparse kind's automatic call size (the shared run, said
  there), the ragged kind's set."""
  if kind == "sparse":
    result = two_replicas(kind)[0]
  else:
    result = dist_keras.fit(lambda: _model_fn(kind), _DATASET_FNS[kind],
                            workdir=str(tmp_path),
                            config={**CONFIG, "train.steps_per_loop": 1},
                            strategy=mirrored)
  assert "input_wait_ms" in result.summary
  for got, want in zip(result.model.get_weights(), _fit_weights_of(kind)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_an_eval_of_ragged_or_sparse_features_is_keras_evaluate(
    tmp_path, mirrored, kind):
  """20 eval examples in per-replica batches of 4: the last step leaves
  replica 1 none. Its one zero example is a ragged row as long as replica
  0's longest (an empty ragged batch reached a GRU, which failed: "Tried to
  stack list which only contains uninitialized tensors"), or a sparse row
  of no values, and counts nowhere: Keras' evaluate on one device."""
  model_fn = lambda: _model_fn(kind, recurrent=True)
  dataset_fn = {"ragged": _ragged_dataset_fn,
                "sparse": _sparse_dataset_fn}[kind]
  result = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path),
                          config={**CONFIG, "train.steps": 2,
                                  "log.sync_timing": False},
                          strategy=mirrored)
  one_device = model_fn()  # (Keras' evaluate fails under Mirrored here.)
  one_device.set_weights(result.model.get_weights())
  loss, mae = one_device.evaluate(
      dataset_fn("eval", tf.distribute.InputContext()), verbose=0)
  assert result.summary["eval_examples"] == SIZES["eval"]
  assert result.summary["eval_loss"] == pytest.approx(loss, rel=1e-5)
  assert result.summary["eval_mae"] == pytest.approx(mae, rel=1e-5)
