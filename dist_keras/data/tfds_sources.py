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
Only `data.download=True` downloads (so does `python -m
dist_keras.prepare_data`).

Splits. "train" is TFDS's "train". "eval" is the held-out split meant for use
during training: "validation" if the dataset has one (imagenet2012, whose
"test" has no labels; tiny_shakespeare), else "test" (mnist, fashion_mnist,
cifar10, imdb_reviews), else the last 10% of "train" (then "train" is the
first 90%). Eval is read in order (one file after another, no file shuffle)
and is finite.

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

Reading (sharding by input pipeline, example ids): tfds_reading.py.
"""
import contextlib
import os

import tensorflow as tf

from dist_keras import catalog, errors
from dist_keras.data import preprocess, tfds_reading
from dist_keras.data.specs import InputSpec
from dist_keras.errors import UserError

PREFIX = catalog.TFDS_PREFIX  # One spelling, checked before TensorFlow too.
_PREPARE_HINT = {"imagenet2012": " --manual_dir DIR_WITH_ILSVRC2012_TARS"}


def is_tfds(name: str) -> bool:
  return name.startswith(PREFIX)


# 'tfds:imdb_reviews/plain_text:1.0.0' -> 'imdb_reviews'.
dataset_name = catalog.tfds_dataset
# How examples are preprocessed: image | imagenet | text | chars.
kind = catalog.tfds_kind


class Source:
  """data.name=tfds:NAME, opened once: the prepared dataset's builder (its
  files checked, `check`), kind, splits and InputSpec."""
  cache = False  # TFDS caches small datasets' records itself (try_autocache).

  def __init__(self, data_cfg):
    self._cfg = data_cfg
    self._builder = builder(data_cfg)
    check(data_cfg, self._builder)
    self.kind = kind(data_cfg.name)
    self._splits = split_names(self._builder.info)
    self.spec = InputSpec(**spec(data_cfg, self._builder.info.features))

  def examples(self, split, seed, input_context=None, with_ids=False):
    """Unbatched (features, label[, id]) of `split` ("train" | "eval"),
    sharded by input pipeline (tfds_reading). Train reads files in a seeded
    shuffled order; eval reads them in order, once."""
    b, tfds_split, train = self._builder, self._splits[split], split == "train"
    if self.kind == "chars":
      return tfds_reading.windows(b, tfds_split, self._cfg.seq_len,
                                  input_context, with_ids)
    decoders = None
    if self.kind == "imagenet":
      # Decode only the random crop of each JPEG, not the whole image.
      decoders = {"image": tfds_reading.tfds_module().decode.SkipDecoding()}
    ds = tfds_reading.read(b, tfds_split, seed=seed if train else None,
                           input_context=input_context, decoders=decoders)
    if self.kind == "imagenet" and train:
      ds = tfds_reading.with_random_seeds(ds, seed, input_context)
    process = preprocess.for_kind(self.kind, self._cfg, b.info.features, train)
    starts = tfds_reading.file_starts(b.info, tfds_split)

    def example(ex, *rng):
      features, label = process(ex, *rng)
      if with_ids:
        return features, label, tfds_reading.example_index(ex["tfds_id"],
                                                           starts)
      return features, label

    return ds.map(example, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True)


def builder(data_cfg):
  """The TFDS builder of `data_cfg.name` in `data_cfg.data_dir` (no I/O)."""
  tfds = tfds_reading.tfds_module()
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
  return (f"python -m dist_keras.prepare_data {name} --data_dir {data_dir}"
          f"{_PREPARE_HINT.get(base, '')}")


def check(data_cfg, b) -> None:
  """Raises UserError unless builder `b` of `data_cfg` is prepared and usable.

  Looks for the prepared files only (no network): an unprepared dataset fails
  in about a second. With data.download=True, prepares it instead (TFDS's
  download_and_prepare, the network path of `tfds.load(download=True)`).
  """
  # The file test first: is_prepared() alone logs a warning when it is absent.
  if not ((b.data_path / "dataset_info.json").exists() and b.is_prepared()):
    name, data_dir = data_cfg.name[len(PREFIX):], b.data_dir_root
    if data_cfg.download:
      _download(b, data_cfg.name, prepare_command(name, data_dir))
    else:
      # Not `tfds build`: tensorflow-datasets 4.9.10's command stops at
      # start without apache_beam, which dist_keras does not install.
      raise UserError(
          f"data.name={data_cfg.name!r} is not prepared in {data_dir} (no "
          f"{b.data_path}/dataset_info.json): on a machine with network run "
          f"`{prepare_command(name, data_dir)}` (then copy {data_dir} here), "
          "or set --config.data.download=True.")
  _check_features(data_cfg, b.info.features)
  if "train" not in b.info.splits:
    raise UserError(f"data.name={data_cfg.name!r} has no 'train' split (it "
                    f"has {', '.join(b.info.splits)}); pick another dataset.")


def _download(b, data_name: str, offline_command: str) -> None:
  """TFDS's download_and_prepare, a failure of which (no network, after
  TFDS's own retries) is one line with the offline way to prepare it."""
  tfds = tfds_reading.tfds_module()
  data_dir = str(b.data_dir_root)
  # Where TFDS makes folders (not the rest of data_dir: other datasets).
  made = [os.path.join(data_dir, "downloads"), os.path.join(data_dir, b.name)]
  before = _folders(made) | ({data_dir} if os.path.isdir(data_dir) else set())
  try:
    b.download_and_prepare()
  except (OSError, tfds.download.DownloadError) as e:
    _remove_empty((_folders(made) | {data_dir}) - before)
    raise UserError(
        f"data.download=True could not prepare {data_name!r} in {data_dir} "
        f"({type(e).__name__}: {errors.cause(str(e))}); check this "
        "machine's network, or prepare it where there is one "
        f"(`{offline_command}`) and copy {data_dir} here.") from e


def _folders(roots) -> set:
  """Every local folder under `roots`, themselves included (gs:// ones are
  left alone: os.walk finds nothing there)."""
  return {path for root in roots for path, _, _ in os.walk(root)}


def _remove_empty(folders: set) -> None:
  """Removes those of `folders` that are empty, deepest first: what a
  failed download_and_prepare made and left empty (downloads/extracted,
  NAME/), never a file."""
  for path in sorted(folders, key=len, reverse=True):
    with contextlib.suppress(OSError):  # Not empty, or not local.
      os.rmdir(path)


def _check_features(data_cfg, features):
  """Raises UserError for settings this dataset's features cannot honour."""
  tfds, k = tfds_reading.tfds_module(), kind(data_cfg.name)
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


def spec(data_cfg, features) -> dict:
  """Keyword arguments of the InputSpec of `data_cfg.name`, whose TFDS
  features are `features`."""
  k = kind(data_cfg.name)
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
