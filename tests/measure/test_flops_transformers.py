"""FLOPs of transformers (measure/flops.py, flop_graph.py): EinsumDense,
MultiHeadAttention, a transformer block from Keras layers and one written
as keras_hub writes its TransformerDecoder (a call that symbolic inputs
cannot run, counted from its TensorFlow graph), each equal to the hand
count; and the TensorFlow ops the count cannot size, named."""
import keras
import pytest
import tensorflow as tf

from dist_keras import quiet
from dist_keras.measure import flops

T, S, D, HEADS, KEY, FFN = 6, 4, 8, 2, 4, 16


class _CachedAttention(keras.layers.MultiHeadAttention):
  """keras_hub's CachedMultiHeadAttention: a `cache` argument, which Keras'
  symbolic call of a MultiHeadAttention does not take."""

  def call(self, query, value, cache=None, training=None):
    del cache  # Decoding only: not given in training.
    return super().call(query, value, training=training)


class _HubBlock(keras.layers.Layer):
  """A post-norm decoder block as keras_hub writes TransformerDecoder: its
  sublayers built in build(), its attention given `cache=None`. Symbolic
  inputs cannot run its call ("got an unexpected keyword argument
  'cache'"): it said TensorFlow BatchMatMulV2, Einsum, MatMul ops which
  the count cannot size, and a GPT2Backbone had no MFU."""

  def __init__(self, dropout=0.0, **kwargs):
    super().__init__(**kwargs)
    # Named: a root name scope may not start with '_' (as a class's does).
    self.attention = _CachedAttention(HEADS, KEY, dropout=dropout,
                                      name="attention")
    self.norms = [keras.layers.LayerNormalization() for _ in range(2)]
    self.up = keras.layers.Dense(FFN, activation="relu")
    self.down = keras.layers.Dense(D)

  def build(self, input_shape):
    self.attention.build(input_shape, input_shape)
    for norm in self.norms:
      norm.build(input_shape)
    self.up.build(input_shape)
    self.down.build((*input_shape[:-1], FFN))

  def call(self, x, training=None):
    h = self.norms[0](x + self.attention(x, x, cache=None, training=training))
    return self.norms[1](h + self.down(self.up(h)))

  def compute_output_shape(self, input_shape):
    return input_shape


class _TfAttention(keras.layers.Layer):
  """Matmuls written with TensorFlow ops: a weight broadcast over the
  batch, adjoint batch matmuls, an einsum and an elementwise einsum."""

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]))
    self.u = self.add_weight(shape=(input_shape[-1], 3))

  def call(self, x):
    q = tf.matmul(x, self.w)  # (B, T, D) x (D, D): broadcast.
    g = tf.matmul(x, q, adjoint_a=True)  # (B, D, T) x (B, T, D).
    s = tf.matmul(q, x, adjoint_b=True)  # (B, T, D) x (B, D, T).
    e = tf.einsum("bts,bsd->btd", tf.nn.softmax(s), x)
    rows = tf.reshape(x, (-1, x.shape[-1]))  # (B T, D)
    r = tf.matmul(self.u, rows, transpose_a=True, transpose_b=True)
    product = tf.einsum("btd,btd->btd", e, tf.matmul(q, g))  # Elementwise.
    return product + tf.reduce_mean(r)


class _TfConvs(keras.layers.Layer):
  """Convolutions written with TensorFlow ops (NHWC)."""

  def build(self, input_shape):
    self.k = self.add_weight(shape=(3, 3, input_shape[-1], 4))
    self.depthwise = self.add_weight(shape=(3, 3, 4, 2))
    self.up = self.add_weight(shape=(2, 2, 5, 8))

  def call(self, x):
    y = tf.nn.conv2d(x, self.k, strides=2, padding="SAME")
    y = tf.nn.depthwise_conv2d(y, self.depthwise, [1, 1, 1, 1], "VALID")
    shape = (tf.shape(y)[0], 2 * y.shape[1], 2 * y.shape[2], 5)
    return tf.nn.conv2d_transpose(y, self.up, shape, strides=2)


class _TfSolve(keras.layers.Layer):
  """A linear-algebra op: no rule sizes it."""

  def call(self, x):
    return tf.linalg.solve(x, x)


class _TfLoop(keras.layers.Layer):
  """A matmul in a TensorFlow loop: it runs as many times as the loop."""

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1], input_shape[-1]))

  def call(self, x):
    return tf.while_loop(lambda i, y: i < 3,
                         lambda i, y: (i + 1, tf.matmul(y, self.w)), (0, x))[1]


def _attention_flops(tokens, sources, width, value_width):
  """Hand count of a MultiHeadAttention, per example: the Q, K, V and output
  projections, then the scores and their weighted sum of the values."""
  inner = HEADS * KEY  # key_dim = value_dim
  projections = (tokens * width + 2 * sources * value_width
                 + tokens * width) * inner
  return 2 * projections + 2 * 2 * tokens * sources * inner


def test_einsum_dense_is_a_matmul_of_its_equation():
  x = keras.Input((T, D))
  layer = keras.layers.EinsumDense("btd,dhk->bthk", (T, HEADS, KEY),
                                   bias_axes="hk")
  counted = flops.count(keras.Model(x, layer(x)))
  assert counted.uncounted == []
  assert (counted.forward, counted.training) == (
      2 * T * D * HEADS * KEY, 3 * 2 * T * D * HEADS * KEY)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_cross_attention_counts_each_projection_and_both_products(dropout):
  """Queries of T tokens over S sources of another width: dot_product_
  attention (no dropout) or einsums (dropout), the same matmuls."""
  query, value = keras.Input((T, D)), keras.Input((S, 5))
  layer = keras.layers.MultiHeadAttention(HEADS, KEY, dropout=dropout)
  counted = flops.count(keras.Model([query, value], layer(query, value)))
  assert counted.uncounted == []
  assert counted.forward == _attention_flops(T, S, D, 5)
  assert counted.training == 3 * counted.forward


def _keras_block(dropout):
  x = keras.Input((T, D))
  attention = keras.layers.MultiHeadAttention(HEADS, KEY, dropout=dropout)
  h = keras.layers.LayerNormalization()(x + attention(x, x))
  ffn = keras.layers.Dense(D)(keras.layers.Dense(FFN, activation="relu")(h))
  return keras.Model(x, keras.layers.LayerNormalization()(h + ffn))


def _hub_block(dropout):
  x = keras.Input((T, D))
  return keras.Model(x, _HubBlock(dropout, name="decoder")(x))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("build", [_keras_block, _hub_block])
def test_a_transformer_block_is_its_attention_and_its_ffn(build, dropout):
  """Layer norms, softmax, residual adds and biases count 0."""
  model = build(dropout)
  counted = flops.count(model)
  hand = _attention_flops(T, T, D, D) + 2 * 2 * T * D * FFN
  assert (counted.forward, counted.uncounted) == (hand, [])
  assert counted.training == 3 * hand
  # TensorFlow's profiler sizes the same MatMul and BatchMatMulV2 ops; it
  # has no Einsum rule, so without dropout it misses the two attention
  # products (Keras' dot_product_attention runs them as Einsum ops).
  missed = 0 if dropout else 2 * 2 * T * T * HEADS * KEY
  assert _profiler_matmul_flops(model) == hand - missed


def test_tensorflow_matmuls_are_sized_from_the_graph():
  """They made the model's FLOPs unknown."""
  x = keras.Input((T, D))
  counted = flops.count(keras.Model(x, _TfAttention()(x)))
  assert counted.uncounted == []
  assert counted.forward == 2 * (T * D * D + D * T * D + T * D * T
                                 + T * T * D + 3 * D * T + T * D * D)


def test_tensorflow_convolutions_are_sized_as_the_profiler_sizes_them():
  x = keras.Input((10, 10, 3))
  model = keras.Model(x, _TfConvs()(x))
  counted = flops.count(model)
  # A 3x3x3x4 conv at 5x5, a 3x3 depthwise (x2) at 3x3 over 4 channels, a
  # 2x2x5x8 transposed conv scattering from 3x3 positions.
  hand = 2 * (5 * 5 * 3 * 3 * 3 * 4 + 3 * 3 * 3 * 3 * 4 * 2
              + 3 * 3 * 2 * 2 * 5 * 8)
  assert (counted.forward, counted.uncounted) == (hand, [])
  assert flops.profiler_forward_flops(model) == hand


def test_an_einsum_with_nothing_summed_is_a_multiply():
  """keras.ops.einsum products count 0, as keras.ops.multiply does; an
  implicit output ('btd,de') keeps the indices written once."""
  x = keras.Input((T, D))
  w = keras.ops.ones((D, 5))
  product = keras.ops.einsum("btd,btd->btd", x, x)
  outer = keras.ops.einsum("btd,e->btde", x, keras.ops.ones((5,)))
  model = keras.Model(x, [keras.ops.einsum("btd,de", product, w), outer])
  assert flops.count(model).forward == 2 * T * D * 5


@pytest.mark.parametrize("layer, why", [
    (_TfSolve, "MatrixSolve ops, which the count cannot size"),
    (_TfLoop, "BatchMatMulV2 ops inside a loop, a condition or a nested function, "
              "which the count cannot size")])
def test_tensorflow_ops_the_count_cannot_size_are_named(layer, why):
  x = keras.Input((D, D))
  counted = flops.count(keras.Model(x, layer(name="op")(x)))
  assert counted.uncounted == [
      f"op ({layer.__name__}): its call has TensorFlow {why}"]
  assert counted.training is None


def _profiler_matmul_flops(model) -> int:
  """FLOPs TensorFlow's profiler gives the MatMul and BatchMatMul* ops of
  `model`'s forward pass on one example (inference mode)."""
  spec = tf.TensorSpec((1, *model.inputs[0].shape[1:]), model.inputs[0].dtype)
  graph = tf.function(lambda x: model(x, training=False)
                      ).get_concrete_function(spec).graph
  builder = tf.compat.v1.profiler.ProfileOptionBuilder
  options = builder(builder.float_operation()).with_empty_output().build()
  with quiet.tf_warnings_off():
    profile = tf.compat.v1.profiler.profile(graph=graph, options=options,
                                            cmd="op")
  ops, total = [profile], 0
  while ops:  # The "op" view nests each op type under the previous one.
    op = ops.pop()
    total += op.float_ops if op.name in ("MatMul", "BatchMatMulV2") else 0
    ops += op.children
  return total
