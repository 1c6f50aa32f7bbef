"""Configs: locked, typed, complete, and documented with a run command."""
import glob
import importlib
import os
import re

import pytest

import helpers
from dist_keras import catalog, configs, train, validate
from dist_keras.errors import UserError

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
  assert f"python -m dist_keras.train --config={name}" in doc
  assert "Result:" in doc


def test_default_is_lstm_on_longmem():
  c = _load("lstm_longmem")
  assert (c.data.name, c.model.name, c.model.cell) == (
      "longmem", "sequence_classifier", "lstm")
  assert c.runtime.strategy == "auto" and c.runtime.num_cpu_devices == 2


@pytest.mark.parametrize("argv,expected", [
    (["--config.train.steps=5"], {"train.steps": 5}),
    (["--config.train.steps", "5"], {"train.steps": 5}),
    (["--config.log.progress=false"], {"log.progress": False}),
    (["--noconfig.log.progress"], {"log.progress": False}),
    (["--config.log.progress", "--config.train.steps=7"],
     {"log.progress": True, "train.steps": 7}),
    (["--config.model.filters=(8, 16)"], {"model.filters": (8, 16)}),
    (["--config.train.learning_rate=1e-3"], {"train.learning_rate": 1e-3}),
    (["--config.data.name=tfds:mnist"], {"data.name": "tfds:mnist"}),
])
def test_command_line_overrides_are_parsed_as_their_keys_types(argv,
                                                              expected):
  rest, overrides = train.split_overrides(["prog", *argv, "--workdir=w"])
  assert rest == ["prog", "--workdir=w"]
  c = configs.from_command_line("cnn_shapes", overrides)  # Reads filters.
  for key, value in expected.items():
    section, field = key.split(".")
    assert c[section][field] == value and type(c[section][field]) is type(
        value), key


@pytest.mark.parametrize("override,message", [
    ("train.steps", "--config.train.steps needs a value"),
    ("train.steps=1.5", "--config.train.steps=1.5 is a float; the key takes "
     "an int: write e.g. `--config.train.steps=800`."),
    ("train.steps=many", "--config.train.steps=many is not an int: write "
     "e.g. `--config.train.steps=800`."),
    ("log.progress=maybe", "--config.log.progress=maybe is not a bool: write "
     "e.g. `--config.log.progress=true`."),
    ("train", "--config.train is not SECTION.KEY=VALUE"),
    ("train.stepz=1", "--config.train.stepz names no config key (did you "
     "mean 'steps'?)"),
    ("model.filters=abc", "--config.model.filters=abc is not a tuple: write "
     "e.g. `--config.model.filters=32,64`."),
])
def test_bad_overrides_are_one_line_user_errors(override, message):
  with pytest.raises(UserError) as error:
    configs.from_command_line("lstm_longmem", [override])
  assert message in str(error.value) and "\n" not in str(error.value)


def test_a_config_file_outside_the_package_loads_with_its_argument(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("from dist_keras.configs import base\n"
                  "def get_config(arg='4'):\n"
                  "  c = base.get_config()\n"
                  "  c.train.steps = int(arg)\n"
                  "  return c\n")
  assert configs.from_command_line(str(path)).train.steps == 4
  assert configs.from_command_line(f"{path}:9").train.steps == 9
  with pytest.raises(UserError, match="could not be loaded"):
    configs.from_command_line(str(tmp_path / "nope.py"))


def test_a_config_argument_its_get_config_cannot_take_says_so(tmp_path):
  """Not "pass a built-in config" for a built-in given an argument, nor
  "fix the file" for a file whose get_config needs one."""
  with pytest.raises(UserError) as raised:
    configs.from_command_line("lstm_longmem:foo")
  assert str(raised.value) == ("--config=lstm_longmem:foo: lstm_longmem's "
                               "get_config() takes no argument; pass "
                               "--config=lstm_longmem")
  path = tmp_path / "mine.py"
  path.write_text("from dist_keras.configs import base\n"
                  "def get_config(steps):\n"
                  "  return base.get_config()\n")
  with pytest.raises(UserError) as raised:
    configs.from_command_line(str(path))
  assert str(raised.value) == (f"--config={path}: {path}'s get_config() "
                               f"needs an argument; pass --config={path}:ARG")


@pytest.mark.parametrize("body,message", [
    ("  c.train.stepz = 10\n", "--config=FILE line 4: 'stepz' names no "
     "config key (did you mean 'steps'?); every key and its default is in "
     "dist_keras.configs.base."),
    ("  c.train.steps = '10'\n", "--config=FILE line 4: the config file "
     "raised TypeError: Could not override field 'steps'"),
    ("  import no_such_module_here\n", "--config=FILE line 4: the config "
     "file raised ModuleNotFoundError: No module named "
     "'no_such_module_here'; run from the folder that holds the module it "
     "imports, or add that folder to PYTHONPATH (or pip install it, if it is "
     "a package)."),
    # ml_collections' AttributeError(KeyError(...)) read as "'\\'trian\\'
    # \\nDid you mean ...'"; "cannot import name" told to fix PYTHONPATH.
    ("  c.trian.steps = 10\n", "--config=FILE line 4: 'trian' names no "
     "config section (did you mean 'train'?); the sections are data, eval, "
     "log, model, runtime, train (dist_keras.configs.base)."),
    ("  from os import not_a_name\n", "--config=FILE line 4: the config "
     "file raised ImportError: cannot import name 'not_a_name' from 'os' ("),
])
def test_a_config_files_own_mistake_is_named_with_its_line(tmp_path, body,
                                                           message):
  """Not "pass a config file's path": the user did; the line and the key."""
  path = tmp_path / "mine.py"
  path.write_text("from dist_keras.configs import base\n"
                  "def get_config():\n"
                  "  c = base.get_config()\n" + body + "  return c\n")
  with pytest.raises(UserError) as raised:
    configs.from_command_line(str(path))
  assert str(raised.value).startswith(message.replace("FILE", str(path)))
  if "ImportError" in message:
    assert str(raised.value).endswith("); fix the name it imports.")


@pytest.mark.parametrize("config,message", [
    ({"train.steps": True}, "train.steps=True is of type bool, but it takes "
     "int values (default 800)"),
    ({"train.steps": None}, "train.steps=None is of type NoneType"),
    ({"log.progress": 1}, "config['log.progress']=1 is an int; the key "
     "takes a bool: pass e.g. True."),
    # An int too large for a float key (OverflowError inside ConfigDict).
    ({"train.learning_rate": 10**400}, "int too large to convert to float"),
])
def test_python_values_of_the_wrong_type_are_refused(config, message):
  """ConfigDict's own type safety lets a bool pass for an int (True would
  train 1 step) and None for anything."""
  with pytest.raises(UserError, match=re.escape(message)):
    configs.resolve(config)
  c = configs.load("lstm_longmem")
  c.train.steps = True
  with pytest.raises(UserError, match="train.steps=True is of type bool"):
    configs.resolve(c)
  assert configs.resolve({"train.learning_rate": 1,
                          "model.filters": [8, 16]}).train.learning_rate == 1


@pytest.mark.parametrize("body,message", [
    ("return {'train': {'steps': 5}}", "get_config() returned a dict, not an "
     "ml_collections.ConfigDict; start from dist_keras.configs.base"),
    ("import ml_collections\n  return ml_collections.ConfigDict()",
     "the config has no data.channels; build it from "
     "dist_keras.configs.base.get_config()"),
])
def test_a_config_file_that_is_not_a_config_is_refused(tmp_path, body,
                                                       message):
  path = tmp_path / "mine.py"
  path.write_text(f"def get_config():\n  {body}\n")
  with pytest.raises(UserError, match=re.escape(message)):
    configs.from_command_line(str(path))


def test_a_folder_or_a_non_python_file_does_not_hide_a_built_in(
    tmp_path, monkeypatch):
  """A workdir named like a built-in (--workdir=lstm_longmem, no --config)
  ran once, then every rerun was refused: the folder hid the default."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "lstm_longmem").mkdir()
  (tmp_path / "rnn_longmem").write_text("x")  # Was an AttributeError.
  assert configs.from_command_line().model.cell == "lstm"
  assert configs.from_command_line("rnn_longmem").model.cell == "simple_rnn"
  (tmp_path / "mine").write_text("x")
  with pytest.raises(UserError, match=re.escape(
      "--config=mine: mine is not a Python file (a config file's name ends "
      "in .py); name a .py file or a built-in config (cnn_cifar10, ")):
    configs.from_command_line("mine")
  (tmp_path / "runs").mkdir()
  with pytest.raises(UserError, match=re.escape(
      "--config=runs could not be loaded (IsADirectoryError: runs is a "
      "folder, not a config file)")):
    configs.from_command_line("runs")


def test_a_typo_of_a_built_in_name_suggests_it(tmp_path, monkeypatch):
  """--config=lstm_longmen listed every built-in but named none, where a
  typo'd config key gets 'did you mean'."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match=re.escape(
      "--config=lstm_longmen could not be loaded (FileNotFoundError: no such "
      "file: lstm_longmen) (did you mean 'lstm_longmem'?); pass a built-in "
      "config (cnn_cifar10, ")):
    configs.from_command_line("lstm_longmen")
  with pytest.raises(UserError) as raised:  # Nothing near: no guess.
    configs.from_command_line("mine_for_today")
  assert "did you mean" not in str(raised.value)


def test_a_built_in_configs_path_where_it_is_not_names_the_built_in(
    tmp_path, monkeypatch):
  """The configs' own docstring command, --config=configs/cnn_shapes.py,
  from an installed wheel (no configs/ in the working folder) said 'could
  not be loaded (FileNotFoundError ...); pass a built-in config (...)'. The
  path is not quietly read as the name; the line gives the name. A file of
  that name that is there is still the user's own."""
  monkeypatch.chdir(tmp_path)
  for spec, fix in [("configs/cnn_shapes.py", "--config=cnn_shapes"),
                    ("cnn_shapes.py:x", "--config=cnn_shapes:x")]:
    with pytest.raises(UserError, match=re.escape(
        f"--config={spec}: there is no file {spec.partition(':')[0]} here; "
        f"pass {fix}, the built-in config's name, which works from any "
        "folder.")):
      configs.from_command_line(spec)
  (tmp_path / "cnn_shapes.py").write_text(
      "from dist_keras.configs import lstm_longmem\n"
      "def get_config():\n  return lstm_longmem.get_config()\n")
  assert configs.from_command_line("cnn_shapes.py").model.cell == "lstm"
  with pytest.raises(UserError, match="could not be loaded"):
    configs.from_command_line("configs/mine.py")  # No built-in's name.


def test_a_key_base_py_does_not_have_is_refused(tmp_path):
  """A config file that unlock()s its config and misspells a key trained
  without it (and wrote the unused key into config.json)."""
  path = tmp_path / "typo.py"
  path.write_text("from dist_keras.configs import base\n"
                  "def get_config():\n"
                  "  c = base.get_config()\n"
                  "  c.unlock()\n"
                  "  c.train.step = 5\n"
                  "  return c\n")
  with pytest.raises(UserError, match=re.escape(
      "config key 'train.step' names no setting (did you mean "
      "'train.steps'?); every key and its default is in "
      "dist_keras.configs.base.")):
    configs.from_command_line(str(path))
  c = configs.load("lstm_longmem")
  c.unlock()
  c.train.seed = 1  # A key of another section: that one is meant.
  with pytest.raises(UserError, match=re.escape(
      "config key 'train.seed' names no setting (did you mean "
      "'runtime.seed'?)")):
    configs.resolve(c)
  c = configs.load("lstm_longmem")
  c.unlock()
  c.extra = 1
  with pytest.raises(UserError, match="config key 'extra' names no setting"):
    configs.resolve(c)


@pytest.mark.parametrize("name", [*CONFIG_FILES, "examples/binary/"
                                  "binary_config.py"])
def test_shipped_configs_have_only_base_keys(name):
  configs.check_types(configs.from_command_line(os.path.join(
      helpers.REPO, name)) if name.endswith(".py") else _load(name))


def test_every_name_validate_declares_resolves():
  """validate.py and catalog.py declare every choice once (they run before
  TensorFlow is imported); each name must reach what acts on it."""
  import importlib  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras import models  # pylint: disable=g-import-not-at-top
  from dist_keras.data import generated  # pylint: disable=g-import-not-at-top
  for model in catalog.MODELS.values():
    assert hasattr(importlib.import_module(
        f"dist_keras.models.{model.module}"), "build")
  for layer in validate.CELLS.values():
    assert issubclass(getattr(keras.layers, layer), keras.layers.Layer)
  assert all(callable(getattr(generated, n)) for n in catalog.GENERATED)
  for name in validate.OPTIMIZERS:
    assert isinstance(models.make(name, learning_rate=0.1),
                      keras.optimizers.Optimizer)
  for name in validate.COLLECTIVES:
    getattr(tf.distribute.experimental.CommunicationImplementation,
            name.upper())


