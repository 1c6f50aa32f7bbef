"""A key the user set that the chosen built-in model or data does not read
is refused before TensorFlow starts: one line naming the key, what does not
read it and what it does read, exit 2, nothing written (configs'
refuse_unread over catalog.py's declarations). Keys the user did not set
(base.py's defaults, a built-in config's own) never are; a user's own
model or data is left to registry.py (tests/contract/test_user_models.py).
A value of the wrong type names the key, the value and the type it takes."""
import os

import pytest

import dist_keras
import helpers
import user_task
from dist_keras import catalog, configs
from dist_keras.errors import UserError

RNN_KEYS = ("model.cell, model.embed_dim, model.units, model.num_layers, "
            "model.chrono_init")
CELL_ON_CNN = (
    "model.name='cnn' does not read model.cell (it reads model.filters, "
    "model.dense_units); drop it, or set model.name to one that reads it: "
    "char_lm, sequence_classifier.")
ONE_FILTER = (
    "--config.model.filters=32 is an int; the key takes a tuple: write "
    "`--config.model.filters=32,` or `--config.model.filters='(32,)'`.")


@pytest.mark.parametrize("args,line", [
    (["--config=cnn_shapes", "--config.model.cell=gru"],
     f"--config.model.cell=gru: {CELL_ON_CNN}"),
    # The default's value: set, it still does nothing (it trained 58 s).
    (["--config.model.filters=32,64"],
     "--config.model.filters=32,64: model.name='sequence_classifier' does "
     f"not read model.filters (it reads {RNN_KEYS}); drop it, or set "
     "model.name to one that reads it: cnn."),
    (["--config=cnn_shapes", "--config.data.seq_len=8"],
     "--config.data.seq_len=8: data.name='shapes' does not read "
     "data.seq_len (it reads data.image_size, data.channels, "
     "data.num_classes, data.train_size, data.eval_size, data.noise, "
     "data.shuffle_buffer); drop it, or set data.name to one that reads "
     "it: longmem, tfds:NAME."),
    (["--config=cnn_mnist", "--config.data.train_size=512"],
     "--config.data.train_size=512: data.name='tfds:mnist' does not read "
     "data.train_size (it reads data.image_size, data.channels, "
     "data.num_classes, data.data_dir, data.download, data.shuffle_buffer);"
     " drop it, or set data.name to one that reads it: longmem, shapes."),
    (["--config=cnn_shapes", "--config.model.filters=32"], ONE_FILTER),
])
def test_the_command_line_refuses_in_one_line_writing_nothing(tmp_path, args,
                                                              line):
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path / 'run'}", *args],
      cwd=str(tmp_path))
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [f"dist_keras: error: {line}"]
  assert result.stdout == "" and os.listdir(tmp_path) == []


def test_refused_before_tensorflow_starts_from_fit_too(tmp_path):
  """The command line's check (configs) and dist_keras.fit's dict and
  ConfigDict, which name the model by its argument."""
  run = str(tmp_path / "run")
  code = (
      "import sys\nimport dist_keras\nfrom dist_keras import configs\n"
      "c = configs.load('cnn_shapes')\nc.model.cell = 'gru'\n"
      "for call in (lambda: configs.from_command_line('cnn_shapes', "
      "['model.cell=gru']), lambda: dist_keras.fit('cnn', 'shapes', "
      f"workdir={run!r}, config={{'model.cell': 'gru'}}), "
      f"lambda: dist_keras.fit('cnn', 'shapes', workdir={run!r}, "
      "config=c)):\n"
      "  try:\n    call()\n"
      "  except dist_keras.UserError as e:\n    print(e)\n"
      "assert 'tensorflow' not in sys.modules\n")
  result = helpers.run_module(["-c", code], timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      f"--config.model.cell=gru: {CELL_ON_CNN}",
      f"config['model.cell']='gru': {CELL_ON_CNN}",
      f"config sets model.cell='gru': {CELL_ON_CNN}"]
  assert not os.listdir(tmp_path)


def test_a_configdicts_keys_set_by_its_built_in_config_are_not_refused():
  """fit's ConfigDict does not say which keys the user set: a value of
  base.py's or of a built-in config counts as not set, so a built-in config
  with its model switched keeps the keys it set, as on the command line;
  another value is the user's."""
  c = configs.load("cnn_cifar10")
  c.model.name = "resnet50"
  assert "model.filters" not in configs.set_in(c, c)
  configs.refuse_unread(c, configs.set_in(c, c))
  c.model.filters = (8,)
  with pytest.raises(UserError) as raised:
    configs.refuse_unread(c, configs.set_in(c, c))
  assert str(raised.value) == (
      "config sets model.filters=(8,): model.name='resnet50' does not read "
      "model.filters (it reads none of model.*); drop it, or set model.name "
      "to one that reads it: cnn.")


def test_a_configdict_for_a_users_own_model_is_checked_by_the_registry(
    tmp_path):
  """A ConfigDict with a user's model_fn: a built-in model's key set is
  refused as a dict's is (registry.py), nothing written."""
  c = configs.load("lstm_longmem")
  c.model.cell = "gru"
  with pytest.raises(UserError) as raised:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), config=c,
                   strategy="one_device")
  assert str(raised.value) == (
      "model.cell='gru' is a setting of the built-in models, but "
      "model.name='user_task:model_fn' is your own: set it in your "
      "model_fn, or leave model.cell at its default ('lstm').")
  assert not os.listdir(tmp_path)


def test_a_config_files_change_is_the_users(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("from dist_keras.configs import base\n"
                  "def get_config():\n  c = base.get_config()\n"
                  "  c.model.name, c.data.name = 'cnn', 'shapes'\n"
                  "  c.model.cell = 'gru'\n  return c\n")
  with pytest.raises(UserError) as raised:
    configs.from_command_line(str(path))
  assert str(raised.value) == (f"--config={path} sets model.cell='gru': "
                               f"{CELL_ON_CNN}")


def test_a_config_file_built_on_a_built_in_keeps_its_keys(tmp_path):
  """A user's file that calls a built-in's get_config() and switches its
  model inherits that config's keys (cnn_shapes' filters): not the
  user's, so not refused for the LSTM; its own change still is."""
  path = tmp_path / "mine.py"
  path.write_text("from dist_keras.configs import cnn_shapes\n"
                  "def get_config():\n  c = cnn_shapes.get_config()\n"
                  "  c.model.name, c.data.name = 'sequence_classifier', "
                  "'longmem'\n  return c\n")
  configs.from_command_line(str(path))
  path.write_text(path.read_text().replace(
      "  return c", "  c.model.filters = (4, 8)\n  return c"))
  with pytest.raises(UserError, match=r"sets model\.filters=\(4, 8\)"):
    configs.from_command_line(str(path))


@pytest.mark.parametrize("override", ["data.name=synthetic",
                                      "model.name=resnet50"])
def test_a_built_in_config_named_by_its_path_keeps_its_own_keys(override):
  """configs/NAME.py, as the docs write it: the keys it sets are its
  model's, not the user's (a switch of model or data keeps them, as by
  name); a copy of it elsewhere is the user's file."""
  name = "resnet50_imagenet" if "data" in override else "cnn_cifar10"
  path = os.path.join(os.path.dirname(configs.__file__), f"{name}.py")
  configs.from_command_line(path, [override])
  configs.from_command_line(name, [override])


def _as_text(value) -> str:
  if isinstance(value, tuple):
    return ",".join(map(str, value)) + ("," if len(value) == 1 else "")
  return str(value)


@pytest.mark.parametrize("name", configs.names())
def test_a_built_in_configs_own_keys_are_never_refused(name):
  """A built-in config sets its own model's and data's keys only: loaded as
  a user's file (each change of base.py's default then counts as set by
  the user) nothing is refused, nor is an override of any key they read."""
  configs.from_command_line(configs.path(name))
  c = configs.load(name)
  inputs = catalog.MODELS[c.model.name].inputs
  reads = [f"model.{k}" for k in catalog.model_reads(c.model.name)] + [
      f"data.{k}" for k in catalog.data_reads(c.data.name, inputs)]
  configs.from_command_line(name, [
      f"{key}={_as_text(c[key.split('.')[0]][key.split('.')[1]])}"
      for key in reads])


def test_keys_the_user_did_not_set_are_never_refused():
  """Another model on the command line: the built-in config's own keys of
  its model (cnn_shapes' filters; the language model's units) stay, unread,
  as base.py's keys of every other model do."""
  c = configs.from_command_line("cnn_shapes", [
      "model.name=sequence_classifier", "data.name=longmem"])
  assert c.model.filters == (16, 32, 64)
  configs.from_command_line("lstm_lm_shakespeare", ["model.name=cnn",
                                                    "data.name=shapes"])
  # A user's model or data: registry.py refuses a built-in's key then.
  configs.from_command_line("lstm_longmem", ["model.name=user_task:model_fn",
                                             "model.units=8",
                                             "data.name=user_task:dataset_fn",
                                             "data.noise=0.5"])


def test_a_one_element_tuple_says_how_to_write_one():
  with pytest.raises(UserError) as raised:
    configs.from_command_line("cnn_shapes", ["model.filters=32"])
  assert str(raised.value) == ONE_FILTER
  for text in ("32,", "(32,)"):  # Both spellings it names read as (32,).
    assert configs.from_command_line(
        "cnn_shapes", [f"model.filters={text}"]).model.filters == (32,)


@pytest.mark.parametrize("config,line", [
    ({"train.steps": "ten"},
     "config['train.steps']='ten' is a str; the key takes an int: pass e.g. "
     "800."),
    ({"model.filters": 32},
     "config['model.filters']=32 is an int; the key takes a tuple: pass "
     "(32,)."),
])
def test_fit_names_the_key_the_value_and_the_type_it_takes(tmp_path, config,
                                                           line):
  with pytest.raises(UserError) as raised:
    dist_keras.fit("cnn", "shapes", workdir=str(tmp_path / "run"),
                   config=config)
  assert str(raised.value) == line
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("key,value", [("runtime.num_cpu_devices", 4),
                                       ("runtime.collective", "ring")])
def test_a_strategy_object_refuses_the_keys_it_decides(tmp_path, key, value):
  """A key that only chooses and builds the strategy, with a strategy
  object given: it would be ignored, so it is refused, nothing written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with pytest.raises(UserError) as raised:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), strategy=strategy,
                   config={key: value, "train.steps": 2,
                           "train.global_batch_size": user_task.GLOBAL_BATCH})
  assert str(raised.value) == (
      f"config[{key!r}]={value!r}: strategy= is a OneDeviceStrategy, which "
      f"decides the devices and collectives, so {key} would be ignored; drop"
      " the key, or pass strategy=None or a name and let the config build "
      "the strategy.")
  assert not os.listdir(tmp_path)
