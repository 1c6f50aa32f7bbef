"""Offline stand-ins for the TFDS datasets the configs use.

`tfds.testing.mock_data` serves random examples with a dataset's real
features, but dist_keras first checks that the dataset is prepared in
data_dir (dataset_info.json, builder.is_prepared()); `write_metadata` puts
the real metadata there, with no data. Used by tools/grid.py and the
tests (no network here).
"""
# Real datasets and their splits, as their prepared metadata lists them.
SPLITS = {
    "mnist": ("train", "test"),
    "fashion_mnist": ("train", "test"),
    "cifar10": ("train", "test"),
    "imdb_reviews": ("train", "test", "unsupervised"),
    "tiny_shakespeare": ("train", "validation", "test"),
    "imagenet2012": ("train", "validation", "test"),
}


def write_metadata(name: str, data_dir: str, examples_per_split: int) -> None:
  """Dataset `name`'s prepared metadata in `data_dir`, one file per split."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir)
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[examples_per_split],
                          num_bytes=0)
      for split in SPLITS[name]]))
  builder.data_path.mkdir(parents=True)
  builder.info.write_to_directory(builder.data_path)
