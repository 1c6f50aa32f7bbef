"""Gradient synchronisation: the explicit all-reduce and the breakdown of a
step's time around it (turning Keras' own reduction off is tested with the
other private Keras parts, in test_keras_internals.py)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from dist_keras.measure import breakdown
from dist_keras.training import allreduce, sparse_grads, steps


def _replica_gradients():
  """Replica r's dense gradient (r + 1 everywhere), None, and an Embedding's
  slice of row 1 (r + 1): 2 replicas sum the dense one to 3."""
  r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
              tf.float32)
  sparse = tf.IndexedSlices(values=tf.fill([1, 3], r + 1.0),
                            indices=tf.constant([1]),
                            dense_shape=tf.constant([4, 3]))
  return [tf.fill([2, 3], r + 1.0), None, sparse]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_reduce_sums_dense_gathers_sparse_and_keeps_none(mirrored,
                                                             dtype):
  """The IndexedSlices stays one, each replica's slice in it (Adam squares
  them one by one, as on one device); bfloat16 compresses the dense sum
  only (TensorFlow's all-gather has no bfloat16 kernel)."""
  dense, none, sparse = mirrored.run(
      lambda: allreduce.all_reduce_gradients(_replica_gradients(), dtype))
  assert none is None
  for value in mirrored.experimental_local_results(dense):
    np.testing.assert_array_equal(value, np.full([2, 3], 3.0))  # 1 + 2
  for value in mirrored.experimental_local_results(sparse):
    assert isinstance(value, tf.IndexedSlices)
    assert value.values.dtype == tf.float32
    np.testing.assert_array_equal(value.indices, [1, 1])
    np.testing.assert_array_equal(value.values, [[1.0] * 3, [2.0] * 3])
    np.testing.assert_array_equal(value.dense_shape, [4, 3])


def test_all_finite_reads_every_value_slices_included():
  """Finite as Keras' LossScaleOptimizer checks it: any NaN or inf, an
  IndexedSlices' among them, is not; a large finite value is; XLA alike."""
  def sparse(value):
    return tf.IndexedSlices(values=tf.constant([[1.0] * 3, [value] * 3]),
                            indices=tf.constant([0, 0]),
                            dense_shape=tf.constant([4, 3]))
  compiled = tf.function(allreduce.all_finite, jit_compile=True)
  for check in (allreduce.all_finite, compiled):
    assert bool(check([sparse(1e30), None, tf.fill([2], 2.0)]))
    assert not bool(check([sparse(np.nan), tf.fill([2], 2.0)]))
    assert not bool(check([sparse(2.0), tf.constant([1.0, np.inf])]))
  assert bool(allreduce.all_finite([None]))


def test_gradients_stay_sparse_off_a_tpu():
  sparse = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 0]),
                            tf.constant([4, 3]))
  kept, none = allreduce.as_reduced([sparse, None])
  assert kept is sparse and none is None


def test_gradient_bytes_counts_every_trainable_float():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
  assert allreduce.gradient_bytes(model.trainable_variables) == (4 * 3 + 3) * 4


def test_breakdown_splits_a_step_exactly():
  # Replica 0 has gradients at 10 ms, replica 1 at 14 ms; both reduced at 15.
  stamps = 1e-3 * np.array([[1.0, 10.0, 15.0, 16.0],
                            [1.0, 14.0, 15.0, 16.5]])
  b = breakdown.split_step(0.0, 0.0008, stamps)
  assert b["batch_ready_ms"] == pytest.approx(0.8)
  assert b["input_wait_ms"] == pytest.approx(1.0)
  assert b["step_ms"] == pytest.approx(16.5)
  assert b["per_replica_compute_ms"] == pytest.approx([10.0, 14.5])
  assert b["compute_ms"] == pytest.approx(12.25)
  assert b["straggler_ms"] == pytest.approx(2.0)  # (4 + 0) / 2
  assert b["straggler_max_ms"] == pytest.approx(4.0)
  assert b["allreduce_ms"] == pytest.approx(1.0)
  assert b["fraction"] == pytest.approx(3.0 / 16.5)


def _job(waits, compute, input_wait=None, outside=None, callbacks=None):
  """stamps.durations_row's rows: (time in the reduction, compute, input
  wait, host time outside the calls, of which in callbacks) of every
  replica of the job, given in ms, in seconds (the last three 0 unless
  given)."""
  zeros = [0.0] * len(waits)
  return 1e-3 * np.array([waits, compute, input_wait or zeros,
                          outside or zeros, callbacks or zeros]).T


def test_the_chief_logs_every_replicas_compute_of_the_job():
  """2 workers, 2 replicas each: this worker's are the job's first two
  (TF's replica order); the other worker's replica 3 computes 40 ms longer
  than the rest, and the chief's sync_replica/3/compute_ms says so, while
  sync/compute_ms and its max stay its own replicas'."""
  stamps = 1e-3 * np.array([[1.0, 10.0, 55.0, 56.0],
                            [1.0, 11.0, 55.0, 56.5]]) + 1e6
  b = breakdown.split_step(1e6, 1e6, stamps,
                           _job(waits=[45.0, 44.0, 45.0, 4.0],
                                compute=[10.0, 11.5, 10.0, 50.0]))
  assert b["per_replica_compute_ms"] == pytest.approx([10.0, 11.5, 10.0, 50.0])
  assert b["compute_ms"] == pytest.approx(10.75)
  assert b["compute_max_ms"] == pytest.approx(11.5)
  assert b["straggler_max_ms"] == pytest.approx(41.0)
  tags = breakdown.SyncLog().add(b)
  assert sorted(t for t in tags if t.startswith("sync_replica/")) == sorted(
      f"sync_replica/{i}/{name}" for i in range(4) for name in (
          "compute_ms", "input_wait_ms", "outside_ms", "callbacks_ms"))
  assert tags["sync_replica/3/compute_ms"] == pytest.approx(50.0)


def test_the_chief_names_the_worker_slow_at_its_input_or_between_steps():
  """2 workers, 2 replicas each. The other worker's replica 3 waited 36 ms
  for its batch (its compute as everyone's), and that worker spent 60 ms a
  step in a callback, its host 70 ms outside the calls; the chief, waiting
  for it at the host's agreement, 65 ms outside, 0 in callbacks. Compute
  alone named no one: the chief's per-replica tags name the worker and
  what it was slow at, and the worst worker's outside time."""
  stamps = 1e-3 * np.array([[1.0, 10.0, 55.0, 56.0],
                            [1.0, 10.0, 55.0, 56.0]]) + 1e6
  b = breakdown.split_step(1e6, 1e6, stamps, _job(
      waits=[45.0, 45.0, 45.0, 9.0], compute=[10.0] * 4,
      input_wait=[1.0, 1.0, 1.0, 37.0], outside=[65.0, 65.0, 70.0, 70.0],
      callbacks=[0.0, 0.0, 60.0, 60.0]))
  tags = breakdown.SyncLog().add(b)
  waits = [tags[f"sync_replica/{i}/input_wait_ms"] for i in range(4)]
  assert waits == pytest.approx([1.0, 1.0, 1.0, 37.0])
  assert [tags[f"sync_replica/{i}/callbacks_ms"] for i in range(4)] == (
      pytest.approx([0.0, 0.0, 60.0, 60.0]))
  assert tags["sync/outside_max_ms"] == pytest.approx(70.0)
  assert tags["sync/callbacks_max_ms"] == pytest.approx(60.0)
  assert tags["sync/input_wait_ms"] == pytest.approx(1.0)  # The chief's own.


def test_one_host_logs_its_own_stamps_whatever_was_gathered():
  """Every replica here: the gathered rows are its own, and the values are
  the local stamps' as before the gather carried compute."""
  stamps = 1e-3 * np.array([[1.0, 10.0, 15.0, 16.0],
                            [1.0, 14.0, 15.0, 16.5]])
  alone = breakdown.split_step(0.0, 0.0008, stamps)
  gathered = breakdown.split_step(0.0, 0.0008, stamps,
                                  _job(waits=[5.0, 1.0], compute=[9.0, 9.0]))
  assert gathered == alone


def test_breakdown_across_workers_compares_durations_not_clocks():
  # This worker's one replica waited 5 ms in the reduction; the job's other
  # replica (another host, another clock) waited 1 ms: it arrived last, so
  # 1 ms is the all-reduce and our extra 4 ms is straggler wait; the job's
  # mean straggler wait is (4 + 0) / 2.
  stamps = 1e-3 * np.array([[1.0, 10.0, 15.0, 16.0]]) + 1e6  # Any clock.
  b = breakdown.split_step(1e6, 1e6 + 0.0008, stamps,
                           _job(waits=[5.0, 1.0], compute=[14.0, 9.0]))
  assert b["straggler_ms"] == pytest.approx(2.0)
  assert b["straggler_max_ms"] == pytest.approx(4.0)
  assert b["allreduce_ms"] == pytest.approx(1.0)
  assert b["input_wait_ms"] + b["compute_ms"] + b["allreduce_ms"] == (
      pytest.approx(b["step_ms"] - 4.0))  # This replica's own 4 ms.
  # This worker's share: its replica's whole 5 ms in the reduction.
  assert b["fraction"] == pytest.approx(5.0 / b["step_ms"])


def test_the_sync_fraction_is_this_workers_share_of_its_step():
  """A peer's wait also spans this worker's host work between steps, so
  the job's straggler wait can exceed this worker's step: the fraction is
  still this worker's own share (at most 1), not (job's straggler + own
  all-reduce) / own step."""
  stamps = 1e-3 * np.array([[1.0, 2.0, 4.0, 5.0]]) + 1e6  # 5 ms step.
  b = breakdown.split_step(1e6, 1e6, stamps,
                           _job(waits=[2.0, 40.0], compute=[2.0, 2.0]))
  assert b["straggler_ms"] == pytest.approx(19.0)  # (0 + 38) / 2
  assert b["fraction"] == pytest.approx(2.0 / 5.0)


def test_a_worker_whose_replica_is_the_slowest_reports_the_jobs_wait():
  """The last to arrive waits for no one: its own wait is all-reduce.
  Yet the job's other replicas waited for it, and that is what the
  chief's sync/straggler_ms says (2 workers: a replica each)."""
  stamps = 1e-3 * np.array([[1.0, 10.0, 15.0, 16.0]]) + 1e6
  last = breakdown.split_step(1e6, 1e6, stamps,
                              _job(waits=[5.0, 7.0], compute=[14.0, 9.0]))
  assert last["allreduce_ms"] == pytest.approx(5.0)
  assert last["straggler_ms"] == pytest.approx(1.0)  # (0 + 2) / 2
  assert last["straggler_max_ms"] == pytest.approx(2.0)
  # 4 replicas, 2 a worker, this worker's the slowest two.
  four = breakdown.split_step(1e6, 1e6, np.concatenate([stamps, stamps]),
                              _job(waits=[5.0, 5.0, 8.0, 11.0],
                                   compute=[14.0] * 4))
  assert four["straggler_ms"] == pytest.approx(2.25)  # (0 + 0 + 3 + 6) / 4
  assert four["straggler_max_ms"] == pytest.approx(6.0)
  assert four["allreduce_ms"] == pytest.approx(5.0)


def test_sync_log_means_and_tags():
  log = breakdown.SyncLog()
  assert log.means() == {}
  stamps = 1e-3 * np.array([[0.0, 2.0, 3.0, 4.0]])
  tags = log.add(breakdown.split_step(0.0, 0.0, stamps))
  assert tags["sync/allreduce_ms"] == pytest.approx(1.0)
  assert tags["sync_replica/0/compute_ms"] == pytest.approx(3.0)
  log.add(breakdown.split_step(0.0, 0.0, 2 * stamps))
  assert log.means()["compute_ms"] == pytest.approx(4.5)


def test_dense_gradients_densifies_slices_and_keeps_none():
  sparse = tf.IndexedSlices(values=tf.ones([2, 3]), indices=tf.constant([0, 0]),
                            dense_shape=tf.constant([4, 3]))
  dense, none = allreduce.dense_gradients([sparse, None])
  assert isinstance(dense, tf.Tensor) and none is None
  # Repeated indices add up, as the embedding's gradient must.
  np.testing.assert_array_equal(dense.numpy()[0], [2.0, 2.0, 2.0])
  np.testing.assert_array_equal(dense.numpy()[1:], np.zeros([3, 3]))


def test_host_value_sum_adds_every_replicas_value(mirrored):
  total = allreduce.host_value_sum(mirrored)
  assert total(3.0) == 6.0  # 2 replicas, each contributing this process's 3.
  assert total(0.0) == 0.0


def test_sent_bytes_count_dense_gradients_and_gathered_slices():
  """Dense gradients at the all-reduce's dtype; an IndexedSlices' values
  and indices as they are (gathered, never compressed)."""
  sparse = tf.IndexedSlices(tf.ones([5, 3]), tf.range(5),  # int32 indices.
                            tf.constant([9, 3]))
  grads = [sparse, None, tf.ones([2, 4])]
  np.testing.assert_array_equal(allreduce.sent_bytes(grads),
                                [8 * 4, 5 * 3 * 4 + 5 * 4])
  np.testing.assert_array_equal(allreduce.sent_bytes(grads, "bfloat16"),
                                [8 * 2, 5 * 3 * 4 + 5 * 4])
  np.testing.assert_array_equal(allreduce.sent_bytes([None]), [0, 0])


def test_sent_bytes_of_shapes_known_only_as_the_step_runs():
  """A batch dimension unknown at trace time: its bytes are counted as the
  step runs, beside the known shapes', summed when traced: a deep model's
  gradients add no op each (586 ops for 194 gradients, then 3)."""

  @tf.function(input_signature=[tf.TensorSpec([None, 4]),
                                tf.TensorSpec([None], tf.int64)])
  def sent(rows, ids):
    return allreduce.sent_bytes(
        [rows, tf.ones([2, 4]), tf.IndexedSlices(rows, ids)])

  np.testing.assert_array_equal(
      sent(tf.ones([3, 4]), tf.range(3, dtype=tf.int64)),
      [3 * 4 * 4 + 8 * 4, 3 * 4 * 4 + 3 * 8])
  ops = []
  for count in (1, 50):
    with tf.Graph().as_default() as graph:
      grads = [tf.zeros([2, 4])] * count
      before = len(graph.get_operations())
      allreduce.sent_bytes(grads)
      ops.append(len(graph.get_operations()) - before)
  assert ops[0] == ops[1], ops


def test_host_value_sum_traces_once_per_strategy_and_lets_it_go():
  """Every agreement of a run (each epoch's, with callbacks) had traced a
  tf.function of its own, and TensorFlow warned of retracing."""
  import gc  # pylint: disable=g-import-not-at-top
  import weakref  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  sums = [allreduce.host_value_sum(strategy) for _ in range(6)]
  assert [total(float(k)) for k, total in enumerate(sums)] == list(
      map(float, range(6)))
  assert allreduce._TOTALS[strategy].experimental_get_tracing_count() == 1  # pylint: disable=protected-access
  gone = weakref.ref(strategy)
  del strategy, sums
  gc.collect()
  assert gone() is None


def _op_types(concrete) -> set:
  """The op types of a traced function, its nested functions' included."""
  graph = concrete.graph
  library = graph.as_graph_def().library.function
  return {op.type for op in graph.get_operations()} | {
      node.op for function in library for node in function.node_def}


@pytest.mark.parametrize("vocab, clip, gathers", [
    (16, 1.0, False), (50_000, 1.0, True), (16, 0.0, True)])
def test_under_a_global_norm_clip_only_a_large_vocabulary_is_gathered(
    mirrored, vocab, clip, gathers):
  """The default model's plain step (an Embedding under Adam) under its
  global_clipnorm all-reduces the Embedding's table: no all-gather, and
  none of the count gather's tf.cond. A 50,000-token table (1.6 MB) sends
  far more than a replica's 192 slices (7 KB): gathered. Without a clip
  Adam sees the slices, gathered (they were gathered under the clip too:
  12,800 slices for Keras' clip to densify on every replica)."""
  c = helpers.tiny_config()
  c.train.global_clipnorm = clip
  c.data.vocab_size = vocab
  with helpers.built(c, mirrored) as run:
    step = steps.make_train_step(mirrored, run.model)
    ops = _op_types(step.get_concrete_function(iter(run.parts.train_ds)))
  assert "CollectiveReduceV2" in ops
  assert ("CollectiveGatherV2" in ops) == gathers
  assert bool(ops & {"If", "StatelessIf"}) == gathers


@pytest.mark.parametrize("replicas, rows, table", [
    (2, 10, True), (2, 11, False), (4, 20, True), (4, 21, False)])
def test_the_table_is_taken_while_it_sends_no_more_bytes(replicas, rows,
                                                          table):
  """8 slices a replica of 4 float32s and an int32 index, 160 bytes: a ring
  all-gather sends n-1 replicas' (2 replicas: 160 bytes, 4: 480); a ring
  all-reduce 2(n-1)/n of the table of `rows` x 4 float32s (2: 16 a row,
  4: 24). A tie takes the table."""
  slices = tf.IndexedSlices(tf.zeros([8, 4]), tf.zeros([8], tf.int32),
                            tf.constant([rows, 4]))
  variable = keras.Variable(np.zeros([rows, 4], np.float32))
  assert sparse_grads.table_sends_less(slices, variable, replicas) == table


def test_slices_of_a_count_unknown_at_trace_time_are_gathered():
  """A dynamic batch shape: the slices could outweigh even a 1-row table,
  or not; gathered (a count of 1 takes that table)."""
  variable = keras.Variable(np.zeros([1, 4], np.float32))
  taken = []

  def trace(indices):
    slices = tf.IndexedSlices(tf.zeros([tf.size(indices), 4]), indices,
                              tf.constant([1, 4]))
    taken.append(sparse_grads.table_sends_less(slices, variable, 2))
    return slices.values

  for shape in ([None], [1]):
    tf.function(trace).get_concrete_function(tf.TensorSpec(shape, tf.int32))
  assert taken == [False, True]


def _sgd(**kwargs):
  return keras.optimizers.SGD(0.1, **kwargs)


@pytest.mark.parametrize("optimizer, dtype, tables", [
    (_sgd(global_clipnorm=1.0), "float32", True),
    (_sgd(), "float32", False),  # Adam would see the slices.
    (_sgd(clipnorm=1.0), "float32", False),  # Clips each slice.
    (_sgd(clipvalue=1.0), "float32", False),
    (_sgd(global_clipnorm=1.0), "bfloat16", False),
    (_sgd(global_clipnorm=1.0, gradient_accumulation_steps=2), "float32",
     False),
    (_sgd(global_clipnorm=1.0, loss_scale_factor=2.0), "float32", False),
    (keras.optimizers.LossScaleOptimizer(_sgd(global_clipnorm=1.0)),
     "float32", False),
])
def test_only_a_global_norm_clip_alone_sums_the_slices(mirrored, optimizer,
                                                       dtype, tables):
  """What sparse_grads' table form is taken for (its module docstring):
  under 2 replicas only; never without an IndexedSlices."""
  variables = [keras.Variable(np.zeros([4, 3], np.float32))]

  def forms():
    return (sparse_grads.table_form(optimizer, variables, [_many_slices()],
                                    dtype),
            sparse_grads.table_form(optimizer, variables,
                                    [tf.zeros([4, 3])], dtype))

  form, dense = mirrored.run(forms)
  assert (form is not None) == tables and dense is None
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  assert one.run(lambda: sparse_grads.table_form(
      optimizer, variables, [_many_slices()], dtype)) is None


def _many_slices():
  """8 slices of a 4 x 3 table: their 128 bytes outweigh its 48, so the
  table is the path of fewer bytes (table_sends_less)."""
  return tf.IndexedSlices(tf.ones([8, 3]), tf.zeros([8], tf.int32),
                          tf.constant([4, 3]))


def test_a_variable_keras_overwrites_or_a_16_bit_gradient_gathers(mirrored):
  """Keras leaves a variable it overwrites with its gradient out of the
  norm; a float16 gradient would be squared in float16 (table_form)."""
  optimizer = _sgd(global_clipnorm=1.0)
  overwritten = keras.Variable(np.zeros([4, 3], np.float32))
  overwritten.overwrite_with_gradient = True
  plain = [keras.Variable(np.zeros([4, 3], np.float32))] * 2

  def forms():
    sparse = _many_slices()
    return [sparse_grads.table_form(optimizer, variables, grads, "float32")
            for variables, grads in [
                (plain, [sparse, tf.zeros([2])]),
                ([plain[0], overwritten], [sparse, tf.zeros([2])]),
                (plain, [sparse, tf.zeros([2], tf.float16)])]]

  taken, overwrites, half = mirrored.run(forms)
  assert taken is not None and overwrites is None and half is None


def test_the_tables_sum_slices_locally_and_their_squares_once(mirrored):
  """Replica r's slice of row 1 (r + 1) becomes its table, summed over the
  replicas like a dense gradient (1 + 2 = 3); the squares go in one number
  (3 x 1 + 3 x 4 = 15), not the table's (27); sent_bytes counts both as
  all-reduced, nothing gathered."""
  tables = sparse_grads.Tables((False, False, True), clip_norm=1.0)

  def replica():
    local = tables.local(_replica_gradients())
    return allreduce.all_reduce_gradients(local), allreduce.sent_bytes(local)

  reduced, sent = mirrored.run(replica)
  dense, none, table, squares = reduced
  assert none is None
  for value in mirrored.experimental_local_results(table):
    np.testing.assert_array_equal(value, [[0.0] * 3, [3.0] * 3, [0.0] * 3,
                                          [0.0] * 3])
  for value in mirrored.experimental_local_results(squares):
    assert float(value) == 15.0
  np.testing.assert_array_equal(mirrored.experimental_local_results(sent)[0],
                                [(2 * 3 + 4 * 3 + 1) * 4, 0])


def test_a_gathered_embedding_is_clipped_by_the_one_norm(mirrored):
  """One Embedding summed into its table, another gathered (its table the
  larger, say): the gathered one stays an IndexedSlices, counted as
  gathered bytes (a slice of 3 float32s and its int32 index), and the clip
  counts every replica's slices' squares (1 x 3 + 4 x 3 = 15, not its
  summed row's 27), as Keras' clip of one device's slices of both does;
  it hands the optimizer the gathered one densified, as Keras does."""
  tables = sparse_grads.Tables((False, False, True, False), clip_norm=1.0)

  def replica():
    dense, none, summed = _replica_gradients()
    gathered = tf.IndexedSlices(summed.values, tf.constant([2]),
                                summed.dense_shape)
    local = tables.local([dense, none, summed, gathered])
    reduced = allreduce.all_reduce_gradients(local)
    return (tables.clip_by_global_norm(reduced[:-1], reduced[-1]),
            isinstance(local[3], tf.IndexedSlices),
            allreduce.sent_bytes(local))

  clipped, kept, sent = mirrored.run(replica)
  assert kept
  np.testing.assert_array_equal(mirrored.experimental_local_results(sent)[0],
                                [(2 * 3 + 4 * 3 + 1) * 4, (3 + 1) * 4])
  one_device = [
      tf.fill([2, 3], 3.0), None,
      tf.IndexedSlices(tf.constant([[1.0] * 3, [2.0] * 3]),
                       tf.constant([1, 1]), tf.constant([4, 3])),
      tf.IndexedSlices(tf.constant([[1.0] * 3, [2.0] * 3]),
                       tf.constant([2, 2]), tf.constant([4, 3]))]
  keras_clip = _sgd(global_clipnorm=1.0)._clip_gradients(one_device)  # pylint: disable=protected-access
  assert clipped[1] is None
  for got, want in zip(clipped, keras_clip):
    if want is None:
      continue
    for value in mirrored.experimental_local_results(got):
      assert not isinstance(value, tf.IndexedSlices)
      np.testing.assert_allclose(value, tf.convert_to_tensor(want),
                                 rtol=1e-6)
  # Keras' norm: the dense 6 x 9 and both Embeddings' slices, 15 each.
  np.testing.assert_allclose(tf.convert_to_tensor(keras_clip[0]),
                             np.full([2, 3], 3.0 / np.sqrt(84.0)), rtol=1e-6)
