"""TensorFlow Datasets sources: data.name="tfds:NAME", read from data.data_dir.

Supported: mnist, fashion_mnist, cifar10 and any other TFDS dataset with an
`image` Image and a `label` ClassLabel feature (CNN); imdb_reviews (LSTM
classifier); tiny_shakespeare (character-level LM); imagenet2012 (ResNet-50).
Each builder returns unbatched `(features, label)` of one split, already
sharded by input pipeline, like dist_keras.data.generated.

Preparing. A dataset must be prepared in `data.data_dir` ("" means TFDS's
default, ~/tensorflow_datasets; gs:// works). `check` looks for the prepared
files first and fails at once with the command that prepares them: `tfds.load`
would try to download, and with no network retries for ~205 s before failing.
Only `data.download=True` downloads (so does tools/prepare_data.py).

Splits. "train" is TFDS's "train". "eval" is the held-out split meant for use
during training: "validation" if the dataset has one (imagenet2012, whose
"test" has no labels; tiny_shakespeare), else "test" (mnist, fashion_mnist,
cifar10, imdb_reviews), else the last 10% of "train" (then "train" is the
first 90%). Eval is read in order (one file after another, no file shuffle)
and is finite.

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

Text. imdb_reviews words are lower-cased and hashed into data.vocab_size
buckets (id 0 is padding, 1..vocab_size-1 are buckets; tf.strings
.to_hash_bucket_fast, a fixed fingerprint). Hashing rather than a vocabulary
built from the train split: no shared state between workers (each computes
the same ids alone, without first agreeing on a vocabulary), nothing to save
next to a checkpoint or load at eval, and deterministic across runs, hosts
and sharding. The cost, collisions, is small at 20k buckets. Reviews keep
their LAST seq_len words, padded at the front: the classifier reads the final
LSTM state, so real words come last, and a review's ending carries its
verdict. tiny_shakespeare is split into windows of seq_len + 1 bytes, one
every seq_len bytes: inputs are the first seq_len bytes, targets the last
seq_len (next-byte prediction over 256 byte values).

Ids. With `with_ids=True`, a builder yields `(features, label, id)`: id is the
example's int64 index in the split (from TFDS's tfds_id: file offset + record
index; the window index for tiny_shakespeare), for exact evaluation.
"""
import re

import numpy as np
import tensorflow as tf

from dist_keras import validate
from dist_keras.data import preprocess
from dist_keras.errors import UserError

PREFIX = validate.TFDS_PREFIX  # One spelling, checked before TensorFlow too.
# A tfds_id, e.g. "mnist-test.tfrecord-00003-of-00004__17": file 3, record 17.
_ID_PATTERN = r"^.*-(\d+)-of-\d+__(\d+)$"
_PREPARE_HINT = {"imagenet2012": " --manual_dir DIR_WITH_ILSVRC2012_TARS"}


def _tfds():
  # Imported on first use: runs on the built-in datasets never pay for it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def is_tfds(name: str) -> bool:
  return name.startswith(PREFIX)


def dataset_name(name: str) -> str:
  """'tfds:imdb_reviews/plain_text:1.0.0' -> 'imdb_reviews'."""
  return re.split(r"[/:]", name[len(PREFIX):])[0]


def kind(name: str) -> str:
  """How examples are preprocessed: image | imagenet | text | chars."""
  return {"imagenet2012": "imagenet", "imdb_reviews": "text",
          "tiny_shakespeare": "chars"}.get(dataset_name(name), "image")


def builder(data_cfg):
  """The TFDS builder of `data_cfg.name` in `data_cfg.data_dir` (no I/O)."""
  tfds = _tfds()
  try:
    return tfds.builder(data_cfg.name[len(PREFIX):],
                        data_dir=data_cfg.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    name = data_cfg.name[len(PREFIX):]
    raise UserError(f"data.name={data_cfg.name!r}: TFDS has no dataset "
                    f"{name!r}; see `tfds.list_builders()`.") from None


def prepare_command(name: str, data_dir: str) -> str:
  """The shell command that prepares dataset `name` into `data_dir`."""
  base = dataset_name(PREFIX + name)
  return (f"python tools/prepare_data.py {name} --data_dir {data_dir}"
          f"{_PREPARE_HINT.get(base, '')}")


def check(data_cfg) -> None:
  """Raises UserError unless `data_cfg` names a prepared, usable dataset.

  Looks for the prepared files only (no network): an unprepared dataset fails
  in about a second. With data.download=True, prepares it instead (TFDS's
  download_and_prepare, the network path of `tfds.load(download=True)`).
  """
  b = builder(data_cfg)
  # The file test first: is_prepared() alone logs a warning when it is absent.
  if not ((b.data_path / "dataset_info.json").exists() and b.is_prepared()):
    if data_cfg.download:
      b.download_and_prepare()
    else:
      name, data_dir = data_cfg.name[len(PREFIX):], b.data_dir_root
      hint = _PREPARE_HINT.get(dataset_name(data_cfg.name), "")
      raise UserError(
          f"data.name={data_cfg.name!r} is not prepared in {data_dir} (no "
          f"{b.data_path}/dataset_info.json): on a machine with network run "
          f"`tfds build {name} --data_dir {data_dir}{hint}` and copy "
          f"{data_dir} here, or run `{prepare_command(name, data_dir)}`, or "
          "set --config.data.download=True.")
  _check_features(data_cfg, b.info.features)
  if "train" not in b.info.splits:
    raise UserError(f"data.name={data_cfg.name!r} has no 'train' split (it "
                    f"has {', '.join(b.info.splits)}); pick another dataset.")


def _check_features(data_cfg, features):
  """Raises UserError for settings this dataset's features cannot honour."""
  tfds, k = _tfds(), kind(data_cfg.name)
  if k == "text" and data_cfg.vocab_size < 2:
    raise UserError(f"data.vocab_size={data_cfg.vocab_size} must be >= 2 "
                    "(id 0 is padding); try 20000.")
  if k in ("text", "chars") and data_cfg.seq_len < 1:
    raise UserError(f"data.seq_len={data_cfg.seq_len} must be >= 1.")
  if k not in ("image", "imagenet"):
    return
  names = list(features.keys())
  if not ("image" in names and "label" in names
          and isinstance(features["image"], tfds.features.Image)
          and isinstance(features["label"], tfds.features.ClassLabel)):
    raise UserError(
        f"data.name={data_cfg.name!r} has features {', '.join(names)}, not "
        "an 'image' Image and a 'label' ClassLabel; use an image "
        "classification dataset, tfds:imdb_reviews or tfds:tiny_shakespeare.")
  height, width, _ = features["image"].shape
  if data_cfg.image_size < 0 or (not data_cfg.image_size and (
      height is None or height != width)):
    raise UserError(
        f"data.image_size={data_cfg.image_size} for {data_cfg.name} (images "
        f"{height}x{width}) must be > 0 (the side to resize to), or 0 for the "
        "native size of square, fixed-size images.")


def spec(data_cfg) -> dict:
  """Keyword arguments of the InputSpec of `data_cfg.name`."""
  k, features = kind(data_cfg.name), builder(data_cfg).info.features
  if k == "chars":
    return {"shape": (data_cfg.seq_len,), "dtype": "int32", "num_classes": 256,
            "vocab_size": 256, "per_token": True}
  num_classes = features["label"].num_classes
  if k == "text":
    return {"shape": (data_cfg.seq_len,), "dtype": "int32",
            "num_classes": num_classes, "vocab_size": data_cfg.vocab_size}
  height, _, channels = features["image"].shape
  size = data_cfg.image_size or height
  return {"shape": (size, size, channels), "dtype": "float32",
          "num_classes": num_classes}


def split_names(info) -> dict:
  """{"train": TFDS split, "eval": TFDS split} for a prepared dataset."""
  for name in ("validation", "test"):
    if name in info.splits:
      return {"train": "train", "eval": name}
  return {"train": "train[:90%]", "eval": "train[90%:]"}


def num_examples(data_cfg, split: str) -> int:
  """Examples in `split` ("train" | "eval"): windows for tiny_shakespeare."""
  b = builder(data_cfg)
  tfds_split = split_names(b.info)[split]
  if kind(data_cfg.name) != "chars":
    return int(b.info.splits[tfds_split].num_examples)
  texts = read(b, tfds_split, shard=False)
  return int(sum((len(ex["text"]) - 1) // data_cfg.seq_len
                 for ex in texts.as_numpy_iterator()))


def sharding_policy(num_files: int, num_pipelines: int) -> str:
  """'none' (one pipeline), 'files' or 'examples': see the module docstring."""
  if num_pipelines <= 1:
    return "none"
  return "files" if num_files >= num_pipelines else "examples"


def build(data_cfg, split, seed, input_context=None, with_ids=False):
  """Unbatched (features, label[, id]) of `split` ("train" | "eval").

  Sharded by input pipeline per the module docstring. Train reads files in a
  seeded shuffled order; eval reads them in order, once.
  """
  b = builder(data_cfg)
  tfds_split = split_names(b.info)[split]
  train = split == "train"
  k = kind(data_cfg.name)
  if k == "chars":
    return _windows(b, tfds_split, data_cfg.seq_len, input_context, with_ids)
  decoders = None
  if k == "imagenet":
    # Decode only the random crop of each JPEG, not the whole image.
    decoders = {"image": _tfds().decode.SkipDecoding()}
  ds = read(b, tfds_split, seed=seed if train else None,
            input_context=input_context, decoders=decoders)
  starts = _file_starts(b.info, tfds_split)
  if k == "imagenet" and train:
    ds = _with_random_seeds(ds, seed, input_context)
  process = preprocess.for_kind(k, data_cfg, b.info.features, train)

  def example(ex, *rng):
    features, label = process(ex, *rng)
    if with_ids:
      return features, label, _example_index(ex["tfds_id"], starts)
    return features, label

  return ds.map(example, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)


def read(b, tfds_split, *, seed=None, input_context=None, decoders=None,
         shard=True):
  """This pipeline's records of `tfds_split` as dicts with a 'tfds_id':
  shuffled by `seed` (train), or in order with seed=None (eval, texts)."""
  train = seed is not None
  tfds = _tfds()
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


def _file_starts(info, tfds_split):
  """The index in the (whole) split of each file's first example."""
  lengths = info.splits[tfds_split.split("[")[0]].shard_lengths or [0]
  return tf.constant(np.cumsum([0] + list(lengths[:-1])), tf.int64)


def _example_index(tfds_id, starts):
  """'...-00003-of-00004__17' -> starts[3] + 17: the index in the split."""
  file_index = tf.strings.to_number(
      tf.strings.regex_replace(tfds_id, _ID_PATTERN, r"\1"), tf.int64)
  record = tf.strings.to_number(
      tf.strings.regex_replace(tfds_id, _ID_PATTERN, r"\2"), tf.int64)
  return tf.gather(starts, file_index) + record


def _with_random_seeds(ds, seed, input_context):
  """Zips a per-example random int64, new each epoch, seeded per pipeline."""
  pipeline = input_context.input_pipeline_id if input_context else 0
  rng = tf.data.Dataset.random(seed=seed * 1009 + pipeline,
                               rerandomize_each_iteration=True)
  return tf.data.Dataset.zip(ds, rng)


def _windows(b, tfds_split, seq_len, input_context, with_ids):
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
