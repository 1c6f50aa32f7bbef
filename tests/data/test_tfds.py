"""TFDS sources, offline: the user's code path on locally prepared data.

Two kinds of local data, neither downloaded:
  * the real datasets' metadata (dataset_info.json, features.json) written to
    a tmp data_dir, with `tfds.testing.mock_data` serving random examples of
    the real feature specs: checks preparedness, split choice, preprocessing;
  * tiny GeneratorBasedBuilders prepared into a tmp data_dir as real TFRecord
    files (4 per split): checks sharding, ids and order on real files.
"""
import importlib.util
import os
import time

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import helpers
from dist_keras import catalog, data, models
from dist_keras.configs import base
from dist_keras.data import preprocess, tfds_reading, tfds_sources
from dist_keras.errors import UserError
from tools import mock_tfds

_spec = importlib.util.spec_from_file_location(
    "prepare_data", os.path.join(helpers.REPO, "tools", "prepare_data.py"))
prepare_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare_data)

SPLITS = mock_tfds.SPLITS
NUM_FILES = 4


class DkTinyImages(tfds.core.GeneratorBasedBuilder):
  """8x8 images whose pixels are the example number (train 0.., test 100..)."""
  VERSION = tfds.core.Version("1.0.0")
  SIZES = {"train": 40, "test": 10}

  def _info(self):
    # DatasetInfo directly: dataset_info_from_configs would look for
    # metadata files next to the class, which needs a package.
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 1)),
            "label": tfds.features.ClassLabel(num_classes=3)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {name: self._generate_examples(size, 100 * i)
            for i, (name, size) in enumerate(self.SIZES.items())}

  def _generate_examples(self, size, first):
    for i in range(first, first + size):
      yield i, {"image": np.full((8, 8, 1), i, np.uint8), "label": i % 3}


class DkTinyTrainOnly(DkTinyImages):
  """Only a train split: eval must be its last 10%."""
  SIZES = {"train": 40}


class DkOffline(DkTinyImages):
  """Preparing it fails as a download does with no network."""

  def _split_generators(self, dl_manager):
    raise ConnectionError("no network\nretried 10 times")


@pytest.fixture(scope="module")
def meta_dir(tmp_path_factory):
  """A data_dir holding the real datasets' metadata (one file per split)."""
  root = tmp_path_factory.mktemp("tfds_meta")
  for name in SPLITS:
    mock_tfds.write_metadata(name, str(root), 8)
  return str(root)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  """A data_dir with the tiny builders prepared, NUM_FILES files per split."""
  root = str(tmp_path_factory.mktemp("tfds_tiny"))
  for name in ("dk_tiny_images", "dk_tiny_train_only"):
    tfds.builder(name, data_dir=root).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=NUM_FILES))
  return root


def _cfg(name, data_dir, config="lstm_longmem"):
  """Config `config` on tfds:`name`, shrunk where that data reads, the
  data keys it does not read at their defaults (fit refuses them)."""
  c = helpers.tiny_config(config)
  c.data.name, c.data.data_dir = f"tfds:{name}", data_dir
  reads, defaults = catalog.data_reads(c.data.name), base.get_config().data
  shrunk = {"seq_len": 6, "vocab_size": 50, "image_size": 16}
  for field in defaults:
    if field not in reads:
      c.data[field] = defaults[field]
    elif field in shrunk:
      c.data[field] = shrunk[field]
  return c


def _take(ds, n=None):
  return list((ds.take(n) if n else ds).as_numpy_iterator())


def _ctx(pipelines, index):
  return tf.distribute.InputContext(pipelines, index, pipelines)


@pytest.mark.parametrize("name", ["mnist", "imagenet2012"])
def test_unprepared_dataset_fails_in_seconds_with_the_fix(
    tmp_path, mirrored, no_network, name):
  c = _cfg(name, str(tmp_path / "empty"))
  workdir = tmp_path / "run"
  start = time.monotonic()
  with pytest.raises(UserError) as e:
    helpers.train(c, str(workdir), mirrored)
  assert time.monotonic() - start < 10
  message = str(e.value)
  assert "\n" not in message
  assert f"data.name='tfds:{name}' is not prepared in {tmp_path}/empty" in (
      message)
  # A command the installed package has (not the checkout's tools/, not
  # `tfds build`: tensorflow-datasets 4.9.10's stops without apache_beam).
  assert (f"`python -m dist_keras.prepare_data {name} --data_dir "
          f"{tmp_path}/empty") in message
  assert "tools/" not in message and "tfds build" not in message
  assert "data.download=True" in message
  assert ("--manual_dir" in message) == (name == "imagenet2012")
  assert not workdir.exists()


def test_unknown_dataset_is_a_user_error(tmp_path, no_network):
  with pytest.raises(UserError, match="TFDS has no dataset 'mnist_typo'"):
    data.source(_cfg("mnist_typo", str(tmp_path)).data)


def test_download_true_prepares_the_dataset(tmp_path):
  c = _cfg("dk_tiny_images", str(tmp_path)).data
  c.unlock()  # data.download is not in base.py yet.
  c.download = True
  assert data.source(c).spec.shape == (16, 16, 1)
  assert (tmp_path / "dk_tiny_images" / "1.0.0" / "dataset_info.json").exists()


def test_a_download_that_fails_is_one_line_with_the_offline_way(tmp_path):
  c = _cfg("dk_offline", str(tmp_path)).data
  c.unlock()
  c.download = True
  (tmp_path / "downloads" / "earlier").mkdir(parents=True)  # Not TFDS's.
  with pytest.raises(UserError) as e:
    data.source(c)
  # TFDS's folders, left empty (downloads/extracted, dk_offline/), are gone.
  assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
      "downloads", "downloads/earlier"]
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(
      f"data.download=True could not prepare 'tfds:dk_offline' in {tmp_path} "
      "(ConnectionError: no network); check this machine's network, or "
      "prepare it where there is one (`python -m dist_keras.prepare_data "
      f"dk_offline --data_dir {tmp_path}`)"), message


@pytest.mark.parametrize("name,shape,dtype,classes", [
    ("mnist", (16, 16, 1), np.float32, 10),
    ("fashion_mnist", (16, 16, 1), np.float32, 10),
    ("cifar10", (16, 16, 3), np.float32, 10),
    ("imagenet2012", (32, 32, 3), np.float32, 1000),
    ("imdb_reviews", (6,), np.int32, 2),
    ("tiny_shakespeare", (6,), np.int32, 256),
])
def test_each_dataset_yields_its_spec(meta_dir, no_network, name, shape, dtype,
                                      classes):
  c = _cfg(name, meta_dir).data
  c.image_size = 32 if name == "imagenet2012" else 16
  # The keys catalog.py declares it reads, alone: reading another fails.
  c = ml_collections.ConfigDict({k: c[k] for k in catalog.data_reads(c.name)})
  with tfds.testing.mock_data(num_examples=8, data_dir=meta_dir):
    spec = data.source(c).spec
    assert (spec.shape, spec.num_classes) == (shape, classes)
    assert spec.per_token == (name == "tiny_shakespeare")
    for split in ("train", "eval"):
      examples = _take(tfds_sources.Source(c).examples(split, seed=0), 8)
      x = np.stack([e[0] for e in examples])
      y = np.stack([e[1] for e in examples])
      assert x.shape[1:] == shape and x.dtype == dtype, split
      assert y.dtype == np.int32 and 0 <= y.min() and y.max() < classes
      if dtype == np.int32:
        assert 0 <= x.min() and x.max() < spec.vocab_size
      elif name == "imagenet2012":  # Normalised: ~zero mean, unit std.
        assert -2.2 < x.min() < -1 and 1.5 < x.max() < 2.7
      else:
        assert 0 <= x.min() and x.max() <= 1 and x.std() > 0.05


def test_eval_split_is_validation_else_test_else_last_tenth(meta_dir,
                                                            tiny_dir):
  chosen = {
      name: tfds_sources.split_names(tfds.builder(
          name, data_dir=meta_dir).info)["eval"] for name in SPLITS}
  assert chosen == {"mnist": "test", "fashion_mnist": "test",
                    "cifar10": "test", "imdb_reviews": "test",
                    "tiny_shakespeare": "validation",
                    "imagenet2012": "validation"}
  c = _cfg("dk_tiny_train_only", tiny_dir).data
  [train], [evals] = _read(c, "train"), _read(c, "eval")
  assert sorted(i for i, _ in train) == list(range(36))
  assert [i for i, _ in evals] == list(range(36, 40))
  assert sorted(p for _, p in train + evals) == list(range(40))


def test_hashed_tokens_are_in_range_deterministic_and_case_blind():
  ids = preprocess.hash_tokens(
      tf.constant("The film was GREAT.<br />the Film, was great!"), 12, 50)
  ids = ids.numpy()
  assert ids.dtype == np.int32 and ids.shape == (12,)
  np.testing.assert_array_equal(ids[:4], 0)  # Padding comes first.
  words = ids[4:]
  assert 1 <= words.min() and words.max() < 50
  np.testing.assert_array_equal(words[:4], words[4:])  # Case, punctuation.
  again = preprocess.hash_tokens(tf.constant("the film was great"), 4, 50)
  np.testing.assert_array_equal(again.numpy(), words[:4])
  # Truncation keeps the LAST words.
  last = preprocess.hash_tokens(tf.constant("x y the film was great"), 4, 50)
  np.testing.assert_array_equal(last.numpy(), words[:4])
  empty = preprocess.hash_tokens(tf.constant(""), 3, 50)
  np.testing.assert_array_equal(empty.numpy(), [0, 0, 0])


def test_lm_targets_are_the_inputs_shifted_by_one_byte(meta_dir):
  text = "To be, or not to be: that is the question."
  inputs, targets = preprocess.byte_windows(tf.constant(text), 8)
  inputs, targets = inputs.numpy(), targets.numpy()
  assert inputs.shape == targets.shape == ((len(text) - 1) // 8, 8)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  raw = np.frombuffer(text.encode(), np.uint8)
  np.testing.assert_array_equal(inputs.ravel(), raw[:inputs.size])
  np.testing.assert_array_equal(targets.ravel(), raw[1:inputs.size + 1])
  c = _cfg("tiny_shakespeare", meta_dir).data
  with tfds.testing.mock_data(num_examples=8, data_dir=meta_dir):
    for x, y in _take(tfds_sources.Source(c).examples("train", seed=0)):
      np.testing.assert_array_equal(x[1:], y[:-1])


def _read(c, split, pipelines=1):
  """Per pipeline: its examples as [(id, pixel value)], labels checked."""
  shards = []
  for i in range(pipelines):
    ctx = _ctx(pipelines, i) if pipelines > 1 else None
    shard = []
    for x, y, example_id in _take(
        tfds_sources.Source(c).examples(split, seed=0, input_context=ctx, with_ids=True)):
      pixel = round(float(x[0, 0, 0]) * 255)  # The generator's example number.
      assert y == pixel % 3
      shard.append((int(example_id), pixel))
    shards.append(shard)
  return shards


@pytest.mark.parametrize("split,size", [("train", 40), ("eval", 10)])
@pytest.mark.parametrize("pipelines,policy", [(2, "files"), (4, "files"),
                                              (5, "examples"), (3, "files")])
def test_pipelines_read_disjoint_shards_that_cover_the_split(
    tiny_dir, no_network, split, size, pipelines, policy):
  c = _cfg("dk_tiny_images", tiny_dir).data
  c.image_size = 8
  assert tfds_reading.sharding_policy(NUM_FILES, pipelines) == policy
  [whole] = _read(c, split)
  shards = _read(c, split, pipelines)
  seen = [example for shard in shards for example in shard]
  # Disjoint, all of the split, and the same id for the same example.
  assert sorted(seen) == sorted(whole)
  assert sorted(i for i, _ in seen) == list(range(size))
  first = 0 if split == "train" else 100
  assert sorted(p for _, p in seen) == list(range(first, first + size))
  assert all(shards)  # No pipeline is left empty.
  if policy == "examples":  # Equal shares, +-1.
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_eval_is_read_once_in_order(tiny_dir):
  c = _cfg("dk_tiny_images", tiny_dir).data
  c.image_size = 8
  [whole] = _read(c, "eval")
  assert [i for i, _ in whole] == list(range(10))
  assert whole == _read(c, "eval")[0]  # The same order every time.
  # Each pipeline's share, too, comes in split order.
  assert all(s == sorted(s) for s in _read(c, "eval", 2))


def test_lm_windows_are_sharded_disjointly(meta_dir):
  c = _cfg("tiny_shakespeare", meta_dir).data
  c.seq_len = 3
  with tfds.testing.mock_data(num_examples=4, data_dir=meta_dir):
    whole = _take(tfds_sources.Source(c).examples("eval", seed=0, with_ids=True))
    shards = [_take(tfds_sources.Source(c).examples("eval", 0, _ctx(2, i), True))
              for i in range(2)]
  ids = sorted(int(e[2]) for shard in shards for e in shard)
  assert ids == [int(e[2]) for e in whole] == list(range(len(whole)))


def test_tensorflow_does_not_auto_shard(tiny_dir):
  c = _cfg("dk_tiny_images", tiny_dir).data
  ds = tfds_sources.Source(c).examples("train", seed=0, input_context=_ctx(2, 0))
  assert ds.options().experimental_distribute.auto_shard_policy == (
      tf.data.experimental.AutoShardPolicy.OFF)


def test_the_language_models_loss_and_accuracy_are_per_token_means():
  """The built-in char LM compiles sparse cross-entropy and accuracy over
  [batch, tokens] labels: both are means over every token (so exp(loss) is
  the perplexity), on the same scale whatever seq_len."""
  labels = tf.constant([[1, 0, 2], [0, 0, 0]])
  logits = tf.random.stateless_normal([2, 3, 4], seed=[0, 1])
  c = helpers.tiny_config("lstm_lm_shakespeare")
  model = models.model_fn(c, data.InputSpec((3,), "int32", 4, 4,
                                            per_token=True))()
  loss = model.compute_loss(y=labels, y_pred=logits)
  per_token = keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)
  np.testing.assert_allclose(loss, tf.reduce_mean(per_token), rtol=1e-6)
  model.compute_metrics(None, labels, logits)
  hits = tf.cast(tf.argmax(logits, -1, tf.int32) == labels, tf.float32)
  accuracy = model.get_metrics_result()["accuracy"]
  np.testing.assert_allclose(accuracy, tf.reduce_mean(hits), rtol=1e-6)


def test_char_lm_and_resnet50_build_for_their_inputs():
  lm_spec = data.InputSpec((6,), "int32", 256, 256, per_token=True)
  c = helpers.tiny_config("lstm_lm_shakespeare").model
  lm = models.build(c, lm_spec)
  assert lm.output_shape == (None, 6, 256)
  with pytest.raises(UserError, match="char_lm' needs per-token labels"):
    models.build(c, data.InputSpec((6,), "int32", 2, 50))
  with pytest.raises(UserError, match="sequence_classifier' needs token"):
    models.build(helpers.tiny_config("lstm_imdb").model, lm_spec)
  image_spec = data.InputSpec((32, 32, 3), "float32", 10)
  resnet = models.build(helpers.tiny_config("resnet50_imagenet").model,
                        image_spec)
  logits = resnet(tf.zeros([2, 32, 32, 3]))
  assert logits.shape == (2, 10)
  assert not np.allclose(tf.reduce_sum(logits, -1), 1.0)  # No softmax.
  with pytest.raises(UserError, match="at least 32x32"):
    models.check(helpers.tiny_config("resnet50_imagenet").model,
                 data.InputSpec((16, 16, 3), "float32", 10))


@pytest.mark.parametrize("config", ["lstm_imdb", "cnn_mnist",
                                    "lstm_lm_shakespeare"])
def test_trains_end_to_end_on_mock_data(tmp_path, mirrored, meta_dir,
                                        no_network, config):
  c = helpers.tiny_config(config)
  c.data.data_dir = meta_dir
  c.train.steps = c.train.log_every = c.train.checkpoint_every = 4
  c.eval.every = 0
  with tfds.testing.mock_data(num_examples=64, data_dir=meta_dir):
    summary = helpers.train(c, str(tmp_path), mirrored)
  assert summary["steps"] == 4
  assert np.isfinite(summary["eval_loss"]) and summary["eval_examples"] > 0
  assert 0 <= summary["eval_accuracy"] <= 1


def test_prepare_data_tool(tmp_path, capsys):
  assert prepare_data.main(["tfds:dk_tiny_images",
                            f"--data_dir={tmp_path}"]) == 0
  assert "dk_tiny_images is prepared in" in capsys.readouterr().out
  assert tfds.builder("dk_tiny_images", data_dir=str(tmp_path)).is_prepared()
  assert prepare_data.main(["dk_offline", f"--data_dir={tmp_path}"]) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err
  assert err.startswith("prepare_data: preparing dk_offline into ")
  assert err.endswith("failed: ConnectionError: no network")
