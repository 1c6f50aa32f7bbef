"""Reading a prepared TFDS split: this input pipeline's records, example ids.

Sharding by input pipeline (never TensorFlow's AutoShard, turned off here):
  * by files when the split has >= num_input_pipelines files: TFDS's
    ReadConfig(input_context=...) gives pipeline i files i, i + P, ... (as
    few as one file apart in size; cheapest: each record is read once);
  * by examples otherwise: pipeline i reads the i-th of P equal (+-1)
    ranges (tfds.even_splits): only its own records, where `ds.shard` would
    decode every record on every pipeline and keep 1/P.
  tiny_shakespeare is one record (the whole text) per split: its unit is the
  window, and windows are sharded with `ds.shard`.
In both cases the shards are disjoint and their union is the split.

Ids. With `with_ids=True`, tfds_sources.Source.examples yields `(features, label, id)`: id is the
example's int64 index in the split (from TFDS's tfds_id: file offset + record
index; the window index for tiny_shakespeare), for exact evaluation.
"""
import numpy as np
import tensorflow as tf

from dist_keras.data import preprocess

# A tfds_id, e.g. "mnist-test.tfrecord-00003-of-00004__17": file 3, record 17.
_ID_PATTERN = r"^.*-(\d+)-of-\d+__(\d+)$"


def tfds_module():
  # Imported on first use: runs on the built-in datasets never pay for it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def sharding_policy(num_files: int, num_pipelines: int) -> str:
  """'none' (one pipeline), 'files' or 'examples': see the module docstring."""
  if num_pipelines <= 1:
    return "none"
  return "files" if num_files >= num_pipelines else "examples"


def read(b, tfds_split, *, seed=None, input_context=None, decoders=None,
         shard=True):
  """This pipeline's records of `tfds_split` as dicts with a 'tfds_id':
  shuffled by `seed` (train), or in order with seed=None (eval, texts)."""
  train = seed is not None
  tfds = tfds_module()
  pipelines = input_context.num_input_pipelines if input_context else 1
  files = len(b.info.splits[tfds_split].file_instructions)
  policy = sharding_policy(files, pipelines) if shard else "none"
  if policy == "files" and not train:
    # Eval shards must be equal (+-1) so that padding every pipeline to
    # ceil(S / P) examples covers them all (exact eval); even_splits reads
    # only its own records, so this costs no extra reading.
    policy = "examples"
  options = tf.data.Options()
  # Sharding is chosen above; TensorFlow must not shard a second time.
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.OFF)
  kwargs = {} if train else {"interleave_cycle_length": 1}  # Eval in order.
  read_config = tfds.ReadConfig(
      input_context=input_context if policy == "files" else None,
      add_tfds_id=True, shuffle_seed=seed if train else None,
      # TFDS caches small datasets' records itself (before decoding);
      # dataset_fn caches only the built-in generated ones.
      try_autocache=True,
      options=options, **kwargs)
  if policy == "examples":
    tfds_split = tfds.even_splits(tfds_split, n=pipelines)[
        input_context.input_pipeline_id]
  return b.as_dataset(split=tfds_split, shuffle_files=train,
                      read_config=read_config, decoders=decoders)


def file_starts(info, tfds_split):
  """The index in the (whole) split of each file's first example."""
  lengths = info.splits[tfds_split.split("[")[0]].shard_lengths or [0]
  return tf.constant(np.cumsum([0] + list(lengths[:-1])), tf.int64)


def example_index(tfds_id, starts):
  """'...-00003-of-00004__17' -> starts[3] + 17: the index in the split."""
  file_index = tf.strings.to_number(
      tf.strings.regex_replace(tfds_id, _ID_PATTERN, r"\1"), tf.int64)
  record = tf.strings.to_number(
      tf.strings.regex_replace(tfds_id, _ID_PATTERN, r"\2"), tf.int64)
  return tf.gather(starts, file_index) + record


def with_random_seeds(ds, seed, input_context):
  """Zips a per-example random int64, new each epoch, seeded per pipeline."""
  pipeline = input_context.input_pipeline_id if input_context else 0
  rng = tf.data.Dataset.random(seed=seed * 1009 + pipeline,
                               rerandomize_each_iteration=True)
  return tf.data.Dataset.zip(ds, rng)


def windows(b, tfds_split, seq_len, input_context, with_ids):
  """(inputs[seq_len], targets[seq_len]) byte windows, sharded by window."""
  texts = read(b, tfds_split, shard=False)
  ds = texts.flat_map(lambda ex: tf.data.Dataset.from_tensor_slices(
      preprocess.byte_windows(ex["text"], seq_len))).enumerate()
  if input_context and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)
  if with_ids:
    return ds.map(lambda i, xy: (xy[0], xy[1], i))
  return ds.map(lambda i, xy: xy)
