"""Built-in datasets: deterministic, disjoint splits, exact sharding."""
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

import helpers
from dist_keras import catalog, data
from dist_keras import validate
from dist_keras.distribute import pipelines
from dist_keras.data import generated
from dist_keras.errors import UserError


def _examples(ds, n=None):
  xs, ys = [], []
  for x, y in (ds.take(n) if n else ds).as_numpy_iterator():
    xs.append(x)
    ys.append(y)
  return np.stack(xs), np.array(ys)


@pytest.mark.parametrize("name,inputs", [
    ("longmem", ""), ("shapes", ""), ("synthetic", "images"),
    ("synthetic", "tokens"), ("synthetic", "per_token")])
def test_each_built_in_dataset_reads_only_the_keys_catalog_declares(
    name, inputs):
  """What catalog.py says a dataset reads is all a user may set for it (a
  key it does not read is refused: configs.refuse_unread), so it must make
  both splits from those keys alone. (TFDS: tests/data/test_tfds.py.)"""
  c = helpers.tiny_config("cnn_shapes").data
  c.name = name
  only = ml_collections.ConfigDict(
      {k: c[k] for k in catalog.data_reads(name, inputs)})
  make = data.dataset_fn(data.source(only, inputs), data.Batching(
      8, 0, c.shuffle_buffer, only.threads, only.prefetch))
  for split in ("train", "eval"):
    x, _ = next(iter(make(split, tf.distribute.InputContext())))
    assert x.shape[0] == 8


def test_longmem_label_is_first_token_and_rest_is_noise():
  c = helpers.tiny_config("lstm_longmem").data
  x, y = _examples(generated.longmem(c, "train", seed=0))
  assert x.shape == (c.train_size, c.seq_len) and x.dtype == np.int32
  np.testing.assert_array_equal(y, x[:, 0] % c.num_classes)
  assert set(np.unique(x[:, 1:])) == set(range(c.vocab_size))


@pytest.mark.parametrize("builder", [generated.longmem, generated.shapes])
def test_deterministic_from_seed(builder):
  c = helpers.tiny_config("cnn_shapes").data
  a, _ = _examples(builder(c, "train", seed=3), 16)
  b, _ = _examples(builder(c, "train", seed=3), 16)
  other, _ = _examples(builder(c, "train", seed=4), 16)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, other)


@pytest.mark.parametrize("builder", [generated.longmem, generated.shapes])
def test_train_and_eval_splits_are_disjoint(builder):
  c = helpers.tiny_config("cnn_shapes").data
  train, _ = _examples(builder(c, "train", seed=0))
  evals, _ = _examples(builder(c, "eval", seed=0))
  train_rows = {row.tobytes() for row in train}
  assert not any(row.tobytes() in train_rows for row in evals)
  assert len(evals) == c.eval_size


def test_shapes_images_are_balanced_and_in_range():
  c = helpers.tiny_config("cnn_shapes").data
  c.image_size, c.train_size = 32, 400
  x, y = _examples(generated.shapes(c, "train", seed=0))
  assert x.shape == (400, 32, 32, 1) and x.dtype == np.float32
  assert 0.0 <= x.min() and x.max() <= 1.0
  counts = np.bincount(y, minlength=c.num_classes)
  assert counts.min() > 60, counts  # ~100 each of 4 classes.
  # A square of the same size covers more pixels than a cross.
  assert x[y == 0].mean() > x[y == 3].mean()


def test_sharding_by_input_pipeline_covers_the_split_exactly_once():
  c = helpers.tiny_config("lstm_longmem").data
  whole = set(generated.indices(c, "eval").as_numpy_iterator())
  shards = [
      list(generated.indices(c, "eval", tf.distribute.InputContext(
          num_input_pipelines=3, input_pipeline_id=i)).as_numpy_iterator())
      for i in range(3)
  ]
  seen = [i for shard in shards for i in shard]
  assert len(seen) == len(set(seen)) == len(whole)
  assert set(seen) == whole


def test_per_replica_batches_have_static_shape():
  c = helpers.tiny_config("lstm_longmem")
  ctx = tf.distribute.InputContext(num_input_pipelines=1,
                                   input_pipeline_id=0,
                                   num_replicas_in_sync=4)
  c.train.global_batch_size = 32
  ds = helpers.builtin_dataset_fn(c)("train", ctx)
  assert ds.element_spec[0].shape.as_list() == [8, c.data.seq_len]
  assert ds.element_spec[1].shape.as_list() == [8]


def test_eval_steps_limits_global_batches(mirrored):
  c = helpers.tiny_config("lstm_longmem")
  c.eval.steps = 2
  ds, _ = helpers.distribute(mirrored, helpers.builtin_dataset_fn(c), "eval", c)
  assert sum(1 for _ in ds) == 2


def test_pipeline_options_change_how_not_what_is_read():
  """data.prefetch and data.threads: the same batches, in the same order."""
  ctx = tf.distribute.InputContext(1, 0, num_replicas_in_sync=2)
  streams = []
  for prefetch, threads in ((True, 0), (False, 0), (True, 3)):
    c = helpers.tiny_config("lstm_longmem")
    c.data.prefetch, c.data.threads = prefetch, threads
    c.train.global_batch_size = 32
    ds = helpers.builtin_dataset_fn(c)("train", ctx)
    assert ds.options().threading.private_threadpool_size == (threads or None)
    streams.append(np.concatenate([x for x, _ in ds.take(5)]))
  np.testing.assert_array_equal(streams[0], streams[1])
  np.testing.assert_array_equal(streams[0], streams[2])


def test_batch_not_divisible_by_replicas_names_both_numbers():
  with pytest.raises(UserError, match=r"global_batch_size=30 .* 4 replicas"):
    pipelines.per_replica_batch_size(30, 4)


@pytest.mark.parametrize("key,value,message", [
    ("name", "mnist_typo", "data.name='mnist_typo' is not one of longmem"),
    ("num_classes", 7, "data.num_classes=7 for shapes must be 1..4"),
])
def test_bad_data_settings_are_refused(key, value, message):
  c = helpers.tiny_config("cnn_shapes")
  setattr(c.data, key, value)
  with pytest.raises(UserError, match=message):  # At the door, else here.
    validate.config(c)
    data.source(c.data)


def test_bad_pipeline_settings_are_refused_before_tensorflow_starts():
  c = helpers.tiny_config("cnn_shapes")
  c.data.threads = -1
  with pytest.raises(UserError, match="data.threads=-1 must be >= 0"):
    validate.config(c)


@pytest.mark.parametrize("per_replica", [False, True])
def test_eval_sees_every_example_exactly_once(mirrored, per_replica):
  import eval_ids  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.data.eval_size = 123  # 123 = 3*32 + 27.
  c.data.pipeline_per_replica = per_replica
  ids = eval_ids.evaluated_ids(mirrored, c)
  np.testing.assert_array_equal(np.sort(ids), np.arange(123))


def test_a_per_replica_distribution_leaves_the_strategy_per_worker(mirrored):
  """TF 2.21's MirroredStrategy remembers per-replica input devices after a
  PER_REPLICA distribution (input._input_devices_kept undoes it): afterwards
  a per-worker run must still build ONE pipeline for the 2 replicas."""
  c = helpers.tiny_config()
  fn, seen = helpers.builtin_dataset_fn(c), []

  def counting(split, ctx):
    seen.append(ctx.num_input_pipelines)
    return fn(split, ctx)

  c.data.pipeline_per_replica = True
  helpers.distribute(mirrored, counting, "eval", c)
  assert seen == [2, 2]
  c.data.pipeline_per_replica = False
  seen.clear()
  helpers.distribute(mirrored, counting, "eval", c)
  assert seen == [1]


def test_one_replica_on_the_host_reads_the_dataset_itself(mirrored):
  """One CPU replica iterates the dataset_fn's own dataset, as Keras' fit
  does with no strategy (no multi-device iterator copying each batch to the
  device it is on); more replicas, or a device elsewhere, get a
  distributed dataset."""
  c = helpers.tiny_config()
  fn = helpers.builtin_dataset_fn(c)
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  ds, spec = helpers.distribute(one, fn, "train", c)
  assert isinstance(ds, tf.data.Dataset)
  assert spec == fn("train", tf.distribute.InputContext()).element_spec
  assert pipelines.reads_on_host(tf.distribute.MirroredStrategy(["/cpu:0"]))
  assert not pipelines.reads_on_host(mirrored)
  assert not pipelines.reads_on_host(tf.distribute.OneDeviceStrategy("/gpu:0"))
  ds, _ = helpers.distribute(mirrored, fn, "train", c)
  assert not isinstance(ds, tf.data.Dataset)
