"""FLOPs of users' own models (measure/flops.py): custom layers, keras.ops,
attention, subclassed models, None sequence lengths. Every figure is the
whole model's or null, never a part presented as the model's."""
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from dist_keras.measure import flops
from dist_keras.measure import mfu

STEPS, FEATURES = 20, 3


class _Block(keras.layers.Layer):
  """A user's residual MLP block: Dense sublayers inside a Layer."""

  def __init__(self, width, **kwargs):
    super().__init__(**kwargs)
    self.up = keras.layers.Dense(4 * width, activation="relu")
    self.down = keras.layers.Dense(width)

  def call(self, x):
    return x + self.down(self.up(x))


class _OpsDense(keras.layers.Layer):
  """A layer written with keras.ops alone."""

  def build(self, input_shape):
    self.k = self.add_weight(shape=(input_shape[-1], 5))

  def call(self, x):
    return keras.ops.relu(keras.ops.matmul(x, self.k))


class _Rows(keras.layers.Layer):
  """Folds the batch into the rows before a Dense: every row counts."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.dense = keras.layers.Dense(3)

  def call(self, x):
    rows = self.dense(keras.ops.reshape(x, (-1, x.shape[-1])))
    return keras.ops.reshape(rows, (-1, x.shape[1], 3))


class _TfSolve(keras.layers.Layer):
  """TensorFlow ops, which a symbolic trace cannot run: a linear solve,
  which no rule sizes (a TensorFlow matmul is sized)."""

  def build(self, input_shape):
    self.k = self.add_weight(shape=(input_shape[-1], input_shape[-1]))

  def call(self, x):
    return tf.transpose(tf.linalg.solve(self.k, tf.transpose(x)))


class _TfScale(keras.layers.Layer):
  """TensorFlow ops, weights, no matmul."""

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1],))

  def call(self, x):
    return tf.math.multiply(x, self.w)


class _Subclassed(keras.Model):

  def __init__(self):
    super().__init__(name="subclassed")
    self.hidden = keras.layers.Dense(8)
    self.out = keras.layers.Dense(2)

  def call(self, x, training=False):
    return self.out(self.hidden(x))


def _rnn_none():
  x = keras.Input((None, FEATURES))
  h = keras.layers.LSTM(16, name="lstm")(keras.layers.Masking(0.0)(x))
  return keras.Model(x, keras.layers.Dense(2)(h))


def test_an_rnn_over_a_none_length_counts_the_steps_the_batches_have():
  """It counted the Dense head alone (2 x 16 x 2) as the model's FLOPs."""
  model = _rnn_none()
  spec = tf.TensorSpec((8, STEPS, FEATURES), tf.float32)
  counted = flops.count(model, spec)
  assert counted.uncounted == []  # Masking has no matmul: not listed.
  assert counted.forward == flops.rnn_flops(4, FEATURES, 16, STEPS) + 2 * 16 * 2
  unknown = flops.count(model)  # No batches: the steps are unknown.
  assert unknown.training is None
  assert [u.split(" ")[0] for u in unknown.uncounted] == ["lstm"]


def test_custom_layers_are_counted_through_their_sublayers():
  """Dense sublayers inside a Layer counted 0 (6,144 of 2.37 M reported)."""
  x = keras.Input((32,))
  h = keras.layers.Dense(64)(x)
  blocks = [_Block(64) for _ in range(3)]
  for block in blocks:
    h = block(h)
  model = keras.Model(x, keras.layers.Dense(2)(h))
  before = [len(b.up._inbound_nodes) for b in blocks]  # pylint: disable=protected-access
  counted = flops.count(model)
  assert counted.uncounted == []  # The residual add is not listed either.
  assert counted.forward == 2 * (32 * 64 + 3 * 2 * 64 * 256 + 64 * 2)
  # TensorFlow's profiler agrees (it also counts biases, relus, adds).
  assert flops.profiler_forward_flops(model) == pytest.approx(
      counted.forward, rel=0.02)
  # The trace leaves no node behind on the user's layers.
  assert [len(b.up._inbound_nodes) for b in blocks] == before  # pylint: disable=protected-access


def test_keras_ops_layers_count_every_row():
  x = keras.Input((7, 4))
  model = keras.Model(x, _Rows()(_OpsDense()(x)))
  assert flops.count(model).forward == 2 * 7 * (4 * 5 + 5 * 3)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_multi_head_attention_counts_projections_and_attention(dropout):
  """Keras runs it as dot_product_attention (no dropout) or as einsums:
  the same matmuls. TensorFlow's profiler counts no Einsum at all."""
  tokens, width, heads, key_dim = 10, 12, 3, 4
  x = keras.Input((tokens, width))
  layer = keras.layers.MultiHeadAttention(heads, key_dim, dropout=dropout)
  counted = flops.count(keras.Model(x, layer(x, x)))
  projections = 4 * tokens * width * heads * key_dim  # Q, K, V, output.
  attention = 2 * tokens * tokens * heads * key_dim  # Scores, then values.
  assert counted.uncounted == []
  assert counted.forward == 2 * (projections + attention)


def test_an_rnn_of_a_known_cell_is_counted_and_of_another_listed():
  x = keras.Input((5, 3))
  gru = keras.layers.RNN(keras.layers.GRUCell(4))(x)
  assert flops.count(keras.Model(x, gru)).forward == 2 * 3 * (3 + 4) * 4 * 5
  cells = keras.layers.StackedRNNCells([keras.layers.GRUCell(4)])
  stacked = keras.layers.RNN(cells, name="stacked")(x)
  assert flops.count(keras.Model(x, stacked)).uncounted == [
      "stacked (RNN): a recurrent layer of a StackedRNNCells cell"]


def test_a_subclassed_model_is_counted_on_the_batches():
  model = _Subclassed()
  model(np.zeros((1, 5), "float32"))
  counted = flops.count(model, tf.TensorSpec((4, 5), tf.float32))
  assert (counted.forward, counted.uncounted) == (2 * (5 * 8 + 8 * 2), [])
  assert not flops.count(model).known  # No batches to trace it on.


class _NoCall(keras.Model):
  """keras.io's GAN shape: sub-models and a train_step, no call()."""

  def __init__(self):
    super().__init__()
    self.generator = keras.Sequential([keras.Input((3,)),
                                       keras.layers.Dense(5)])


def test_a_model_without_a_call_says_so_in_one_short_reason():
  """Keras' 300-character NotImplementedError ('Could not automatically
  infer the output shape / dtype of ...'), said at the start and end."""
  model = _NoCall()
  assert flops.count(model, tf.TensorSpec((4, 5), tf.float32)).uncounted == [
      f"{model.name} (_NoCall): no call() of its own to count"]


class _FailingCall(keras.Model):
  def call(self, x):
    raise NotImplementedError("needs concrete values")


def test_a_model_the_count_cannot_call_says_why_in_whole_words():
  """Keras' long message was cut mid-word ("... the `X.call()` method i)")."""
  model = _FailingCall()
  (line,) = flops.count(model, tf.TensorSpec((4, 5), tf.float32)).uncounted
  head = (f"{model.name} (_FailingCall): its output shape could not be "
          "worked out (NotImplementedError: Could not automatically infer "
          "the output shape / dtype of")
  assert line.startswith(head) and line.endswith("...)"), line
  said = line[len(head) - len("Could not automatically infer the output "
                              "shape / dtype of"):-len("...)")]
  keras_text = " ".join(_failing_call_message(model).split())
  assert keras_text.startswith(said) and keras_text[len(said)] == " "


def _failing_call_message(model) -> str:
  try:
    model.compute_output_spec(keras.KerasTensor((4, 5)))
  except NotImplementedError as e:
    return str(e)
  raise AssertionError("a failing call() had an output")


def test_an_uncountable_call_makes_the_flops_unknown_not_partial():
  """A layer the count cannot size made the rest pass for the model."""
  x = keras.Input((6,))
  h = _TfSolve(name="tf_solve")(keras.layers.Dense(6)(x))
  counted = flops.count(keras.Model(x, _TfScale(name="scale")(h)))
  assert counted.uncounted == [
      "tf_solve (_TfSolve): its call has TensorFlow MatrixSolve ops, which "
      "the count cannot size"]  # The weighted, matmul-free scale is not listed.
  usage = mfu.Utilisation(counted, mfu.Peak(1.0, "configured", 1, "worker"),
                          "float32")
  assert (usage.summary(100.0)["flops_per_example"],
          usage.summary(100.0)["mfu"]) == (None, None)
  assert usage.scalars(100.0) == {"perf/model_tflops": None,
                                  "perf/mfu": None}
  assert usage.line(100.0).startswith("model FLOPs unknown (not counted: "
                                      "1 call, named at the start)")


def _sequences(split, input_context):
  rng = np.random.default_rng(0 if split == "train" else 1)
  x = rng.normal(size=(64, STEPS, FEATURES)).astype("float32")
  ds = tf.data.Dataset.from_tensor_slices((x, (x[:, 0, 0] > 0) * 1))
  return ds.repeat().batch(8, drop_remainder=True) if split == "train" \
      else ds.batch(8)


def _compiled(model):
  model.compile(optimizer="sgd", loss=keras.losses.
                SparseCategoricalCrossentropy(from_logits=True))
  return model


def _uncountable():
  x = keras.Input((STEPS, FEATURES))
  return keras.Model(x, keras.layers.Dense(2)(_TfSolve(name="tf_solve")(
      keras.layers.LSTM(4)(x))))


@pytest.mark.parametrize("model_fn", [_rnn_none, _uncountable])
def test_a_run_reports_the_whole_models_flops_or_none(tmp_path, capsys,
                                                      model_fn):
  config = {"train.global_batch_size": 8, "train.steps": 4,
            "train.log_every": 2, "eval.every": 0, "log.progress": True,
            "log.peak_tflops": 1.0}
  helpers.fit_fns(lambda: _compiled(model_fn()), _sequences, tmp_path, config)
  summary = json.load(open(os.path.join(tmp_path, "summary.json")))
  tags = helpers.scalar_tags(str(tmp_path))
  out = capsys.readouterr().out
  if model_fn is _rnn_none:
    assert summary["flops_per_example"] == 3 * (
        flops.rnn_flops(4, FEATURES, 16, STEPS) + 2 * 16 * 2)
    assert summary["mfu"] > 0 and "perf/mfu" in tags
    return
  assert (summary["flops_per_example"], summary["mfu"]) == (None, None)
  assert summary["flops_uncounted"][0].startswith("tf_solve (_TfSolve)")
  assert "perf/mfu" not in tags and "perf/model_tflops" not in tags
  assert ("model FLOPs unknown, so no MFU; not counted: tf_solve "
          "(_TfSolve): its call has TensorFlow MatrixSolve ops") in out
