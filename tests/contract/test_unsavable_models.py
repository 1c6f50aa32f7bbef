"""A model Keras cannot save whole (keras.io's GANs and VAE: a subclassed
model whose __init__ takes its networks, no get_config()) trains as Keras'
fit trains it, which writes no file: the run saves its weights as
model.weights.h5, says so in one line before its first step, names the
file in summary.json and FitResult, and a rerun of the finished workdir
reads it back (contract/saving.py, training/run_files.py, ending.py).
Such a GAN's compiled optimizer (Keras' default, never stepped) is not the
learning rate TensorBoard shows: its own optimizers' are (lr.py).
"""
import contextlib
import io
import os
import shutil

import keras
import numpy as np
import pytest

import helpers
import parity_task
from dist_keras.contract import saving

STEPS = 4
CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": STEPS, "train.log_every": 2,
          "train.checkpoint_every": STEPS, "eval.every": 0,
          "log.calibration_steps": 0, "log.peak_tflops": 1.0,
          "log.progress": True}
LINE = ("model 'gan_of_networks' cannot be saved as model.keras (Object "
        "GanOfNetworks was created by passing non-serializable argument "
        "values in `__init__()`, and therefore the object must override "
        "`get_config()` in order to be serializable. Please implement "
        "`get_config()`); the run saves its weights as model.weights.h5 "
        "instead (load them with model.load_weights(path) into the model "
        "model_fn builds). For model.keras, give the model and each custom "
        "layer, loss or metric a get_config() that returns its __init__ "
        "arguments (a model or layer among them as "
        "keras.saving.serialize_keras_object(it)) and a from_config() that "
        "deserializes those (https://keras.io/guides/serialization_and_saving/)")


def _fit(workdir):
  """dist_keras.fit of the GAN on one device: (FitResult, its stdout)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    result = helpers.fit_fns(parity_task.gan_of_networks,
                             parity_task.images_dataset_fn, workdir, CONFIG)
  return result, out.getvalue()


@pytest.fixture(name="run", scope="module")
def _run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("gan")
  return (workdir, *_fit(workdir))


def _saved_weights(path) -> list:
  model = parity_task.gan_of_networks()
  model.load_weights(str(path))
  return model.get_weights()


def test_it_trains_and_its_weights_are_saved(run):
  """It was refused before training (exit 2), though fit trains it."""
  workdir, result, out = run
  path = workdir / "model.weights.h5"
  assert out.count(LINE + "\n") == 1, out
  assert f"step {STEPS}/{STEPS}" in out
  assert path.exists() and not (workdir / "model.keras").exists()
  assert result.summary["model_file"] == "model.weights.h5"
  assert result.model_file == str(path)
  for a, b in zip(result.model.get_weights(), _saved_weights(path)):
    np.testing.assert_array_equal(a, b)


def test_a_rerun_of_the_finished_workdir_reads_the_weights_back(run, tmp_path):
  """The rerun returns the model its run saved (here, weights written
  over the saved file: not the checkpoint's)."""
  workdir, result, _ = run
  shutil.copytree(workdir, tmp_path / "w")
  os.remove(tmp_path / "w" / ".lock")
  path = tmp_path / "w" / "model.weights.h5"
  model = parity_task.gan_of_networks()
  model.set_weights([w + 1.0 for w in result.model.get_weights()])
  model.save_weights(str(path))
  again, out = _fit(tmp_path / "w")
  assert ("this workdir already finished at step 4 (train.steps reached): "
          "its summary.json and model.weights.h5 are kept as that run wrote "
          "them") in out, out
  for a, b in zip(again.model.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert again.model_file == str(path)


def test_a_damaged_weights_file_is_written_again_by_the_rerun(run, tmp_path):
  workdir, result, _ = run
  shutil.copytree(workdir, tmp_path / "w")
  os.remove(tmp_path / "w" / ".lock")
  path = tmp_path / "w" / "model.weights.h5"
  path.write_bytes(path.read_bytes()[:1000])
  again, out = _fit(tmp_path / "w")
  assert ("model.weights.h5 does not read back (a damaged file): this rerun "
          "evaluates the last checkpoint and writes it again") in out, out
  for a, b in zip(result.model.get_weights(), _saved_weights(path)):
    np.testing.assert_array_equal(a, b)
  assert again.summary["steps"] == STEPS


def test_the_learning_rates_logged_are_of_the_optimizers_that_step(run):
  """Its compiled optimizer is Keras' default RMSprop(0.001), never
  stepped: TensorBoard's learning_rate showed 0.001 at every step, and not
  the rates of d_optimizer (3e-3) and g_optimizer (2e-3)."""
  workdir, result, _ = run
  assert int(result.model.optimizer.iterations.numpy()) == 0
  scalars = helpers.scalar_tags(str(workdir))
  assert "learning_rate" not in scalars
  for tag, rate in (("learning_rate/d_optimizer", 3e-3),
                    ("learning_rate/g_optimizer", 2e-3)):
    assert [step for step, _ in scalars[tag]] == [2, 4]
    np.testing.assert_allclose([v for _, v in scalars[tag]], rate, rtol=1e-6)


class Apply(keras.layers.Layer):
  """Takes a function in __init__, no get_config()."""

  def __init__(self, fn):
    super().__init__()
    self.fn = fn

  def call(self, x):
    return self.fn(x)


class BadConfig(keras.layers.Dense):
  """A get_config() with a bug of its own."""

  def get_config(self):
    return {**super().get_config(), "scale": self.scale}


def test_why_a_model_cannot_be_saved_is_keras_own_line_or_the_error_named():
  inputs = keras.Input((parity_task.FEATURES,))
  apply = keras.Model(inputs, Apply(lambda t: 2.0 * t)(inputs))
  assert saving.unsavable(apply).startswith(
      "Object Apply was created by passing non-serializable argument values"
      " in `__init__()`, and therefore the object must override "
      "`get_config()`")
  bad = keras.Model(inputs, BadConfig(1)(inputs))
  assert saving.unsavable(bad) == (
      "AttributeError: 'BadConfig' object has no attribute 'scale'")
  assert saving.unsavable(keras.Model(inputs, keras.layers.Dense(1)(inputs))
                          ) is None
