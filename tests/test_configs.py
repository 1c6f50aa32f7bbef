"""Configs: locked, typed, complete, and documented with a run command."""
import glob
import importlib
import os

import pytest

import helpers

CONFIG_FILES = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(helpers.REPO, "configs", "*.py"))
    if not os.path.basename(p).startswith("_"))
CONTRACT_KEYS = [
    "runtime.strategy", "runtime.num_cpu_devices", "runtime.tpu",
    "runtime.seed", "data.name", "data.data_dir", "model.name", "model.cell",
    "train.optimizer", "train.global_batch_size", "train.steps",
    "train.learning_rate", "train.log_every", "train.checkpoint_every",
    "eval.every", "eval.steps",
]


def _load(name):
  return importlib.import_module(f"dist_keras.configs.{name}").get_config()


def test_the_shipped_experiments_exist():
  assert {"base", "lstm_longmem", "rnn_longmem", "cnn_shapes"} <= set(
      CONFIG_FILES)


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_has_contract_keys(name):
  c = _load(name)
  for key in CONTRACT_KEYS:
    section, field = key.split(".")
    assert field in c[section], key
  assert set(c.keys()) == {"runtime", "data", "model", "train", "eval", "log"}


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_is_locked_against_unknown_keys(name):
  c = _load(name)
  with pytest.raises(AttributeError):
    c.train.stepz = 10


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_rejects_wrong_types(name):
  c = _load(name)
  with pytest.raises(TypeError):
    c.train.steps = "many"


@pytest.mark.parametrize("name", [n for n in CONFIG_FILES if n != "base"])
def test_experiment_docstring_gives_run_command_and_result(name):
  doc = importlib.import_module(f"dist_keras.configs.{name}").__doc__
  assert f"python -m dist_keras.train --config=configs/{name}.py" in doc
  assert "Result:" in doc


def test_default_is_lstm_on_longmem():
  c = _load("lstm_longmem")
  assert (c.data.name, c.model.name, c.model.cell) == (
      "longmem", "sequence_classifier", "lstm")
  assert c.runtime.strategy == "auto" and c.runtime.num_cpu_devices == 2
