"""Slices every replica looks up alike (a position Embedding's): told from a
token Embedding's and a per-example lookup's by the graph at trace time,
all-reduced position by position, counted as all-reduced bytes."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from dist_keras.training import allreduce, shared_slices, sparse_grads

BATCH, LENGTH = 4, 5


def _positions(x):
  return keras.ops.arange(0, keras.ops.shape(x)[-1], 1)


# lookup(x int32[4, 5]) -> the Embedding's indices; whether they are shared.
LOOKUPS = {
    "arange": (_positions, True),
    "constant with repeats": (lambda x: tf.constant([0, 0, 3]), True),
    "tokens": (lambda x: x, False),
    "positions per example": (lambda x: keras.ops.broadcast_to(
        _positions(x), keras.ops.shape(x)), False),
    "zeros per example": (lambda x: tf.fill(keras.ops.shape(x), 0), False),
    "positions tiled per example": (
        lambda x: tf.tile(_positions(x), [keras.ops.shape(x)[0]]), False),
    "random": (lambda x: tf.random.uniform([3], 0, LENGTH, tf.int32), False),
}


EMBEDDING = keras.layers.Embedding(LENGTH, 3)
EMBEDDING.build()


def _slices(lookup, x):
  """The gradient of an Embedding(LENGTH, 3) looked up by `lookup(x)`."""
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(EMBEDDING(lookup(x)) ** 2)
  return tape.gradient(loss, EMBEDDING.trainable_variables)[0]


@pytest.mark.parametrize("name", LOOKUPS)
def test_indices_from_constants_alone_are_shared(name):
  lookup, shared = LOOKUPS[name]
  found = {}

  def trace(x):
    slices = _slices(lookup, x)
    found["shared"] = shared_slices.summed(slices)
    return slices.values

  spec = tf.TensorSpec([BATCH, LENGTH], tf.int32)
  tf.function(shared_slices.knowing_batch(trace)).get_concrete_function(spec)
  assert found["shared"] == shared


@pytest.mark.parametrize("name", ["arange", "tokens"])
def test_slices_a_called_function_returns_are_read_through_it(name):
  """train.jit_compile's forward and backward pass is a function the step
  calls: the walk follows the slices into it and its arguments out."""
  lookup, shared = LOOKUPS[name]
  found = []
  compute = tf.function(lambda x: _slices(lookup, x), jit_compile=True)

  def trace(x):
    found.append(shared_slices.summed(compute(x)))
    return x

  spec = tf.TensorSpec([BATCH, LENGTH], tf.int32)
  tf.function(shared_slices.knowing_batch(trace)).get_concrete_function(spec)
  assert found == [shared]


def test_a_sparse_inputs_columns_are_still_summed_by_column():
  """A sparse input's Dense kernel: a slice per distinct column of the
  batch (a tf.unique's), not shared; still summed by index after the
  gather (allreduce.distinct_slices)."""
  dense = keras.layers.Dense(3)
  dense.build((None, LENGTH))
  found = {}

  def trace(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(dense(tf.sparse.from_dense(x)) ** 2)
    slices = tape.gradient(loss, dense.kernel)
    found.update(sparse=isinstance(slices, tf.IndexedSlices),
                 shared=shared_slices.summed(slices),
                 distinct=allreduce.distinct_slices(slices))
    return loss

  spec = tf.TensorSpec([BATCH, LENGTH], tf.float32)
  tf.function(shared_slices.knowing_batch(trace)).get_concrete_function(spec)
  assert found == {"sparse": True, "shared": False, "distinct": True}


def test_nothing_is_shared_without_the_replicas_batch_or_eagerly():
  """Outside a replica step wrapped by knowing_batch (the batch's size
  unknown), and eagerly, the slices are gathered as before."""
  found = []

  def trace(x):
    found.append(shared_slices.summed(_slices(_positions, x)))
    return x

  spec = tf.TensorSpec([BATCH, LENGTH], tf.int32)
  tf.function(trace).get_concrete_function(spec)
  assert found == [False]
  x = tf.zeros([BATCH, LENGTH], tf.int32)
  assert not shared_slices.knowing_batch(
      lambda x: shared_slices.summed(_slices(_positions, x)))(x)


def test_an_arange_as_long_as_the_batch_stays_gathered():
  """Its indices could be one per example: gathered, as before the fix."""
  found = []

  def trace(x):
    found.append(shared_slices.summed(_slices(_positions, x)))
    return x

  spec = tf.TensorSpec([LENGTH, LENGTH], tf.int32)
  tf.function(shared_slices.knowing_batch(trace)).get_concrete_function(spec)
  assert found == [False]


def _replica_slices(x):
  """Replica r's gradient of a constant lookup [0, 0, 3] (a repeat among
  them): slice j is (r + 1) * (j + 1); a token lookup's beside it."""
  r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
              tf.float32)
  indices = tf.constant([0, 0, 3])
  shared = tf.IndexedSlices(
      (r + 1.0) * tf.constant([[1.0] * 3, [2.0] * 3, [3.0] * 3]), indices,
      tf.constant([LENGTH, 3]))
  tokens = tf.IndexedSlices(tf.ones([BATCH, 3]), tf.reshape(x[:, 0], [-1]),
                            tf.constant([LENGTH, 3]))
  return shared, tokens


def test_shared_slices_are_summed_slice_by_slice(mirrored):
  """Each position keeps its one slice, the replicas' values summed
  (1 + 2 = 3 times slice j's), a repeated index kept apart as one device
  keeps it; counted as all-reduced bytes (3 x 3 float32s), the token
  slices as gathered (4 x (3 float32s + an int32))."""

  @shared_slices.knowing_batch
  def replica(x):
    grads = list(_replica_slices(x))
    return allreduce.all_reduce_gradients(grads), allreduce.sent_bytes(grads)

  x = tf.zeros([BATCH, LENGTH], tf.int32)
  (shared, tokens), sent = mirrored.run(
      tf.function(replica, autograph=False), args=(x,))
  for value in mirrored.experimental_local_results(shared):
    assert isinstance(value, tf.IndexedSlices)
    np.testing.assert_array_equal(value.indices, [0, 0, 3])
    np.testing.assert_array_equal(value.values, [[3.0] * 3, [6.0] * 3,
                                                 [9.0] * 3])
  for value in mirrored.experimental_local_results(tokens):
    assert value.values.shape[0] == 2 * BATCH  # Gathered.
  np.testing.assert_array_equal(mirrored.experimental_local_results(sent)[0],
                                [3 * 3 * 4, BATCH * (3 * 4 + 4)])


def test_a_global_norm_clip_never_sums_shared_slices_into_a_table(mirrored):
  """Their squares are taken after the all-reduce (one device's), from
  the summed slices: a replica's table would square its own."""
  optimizer = keras.optimizers.SGD(0.1, global_clipnorm=1.0)
  variables = [keras.Variable(np.zeros([LENGTH, 3], np.float32))] * 2

  @shared_slices.knowing_batch
  def replica(x):
    form = sparse_grads.table_form(optimizer, variables,
                                   list(_replica_slices(x)), "float32")
    return form.summed

  x = tf.zeros([BATCH, LENGTH], tf.int32)
  summed = mirrored.run(tf.function(replica, autograph=False), args=(x,))
  assert summed == (False, True)
