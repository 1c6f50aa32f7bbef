"""What trains: config.model.name and config.data.name -> the model_fn and
dataset_fn of the contract (contract/checks.py).

A built-in name (catalog.MODELS; catalog.DATASETS or tfds:NAME) picks a
built-in, which reads its settings from the config (one the user set that
it does not read was refused with the config: configs.refuse_unread);
built-in data is a source opened and checked once (data.source).
`PKG.MODULE:FN` names a user's own function (contract/imports.py). Either
side may be the user's: a built-in model on a user's data reads the data's
shape from the config (data.seq_len, vocab_size, num_classes;
data.image_size, channels).
"""
from dist_keras import catalog
from dist_keras import data
from dist_keras import models
from dist_keras.contract import imports
from dist_keras.configs import base
from dist_keras.errors import UserError

# Keys only the built-in models read (and their compiled optimizer).
MODEL_KEYS = tuple(f"model.{k}" for k in base.get_config().model
                   if k != "name") + (
                       "train.optimizer", "train.learning_rate",
                       "train.momentum", "train.global_clipnorm")
# Keys only the built-in datasets read.
DATA_KEYS = tuple(f"data.{k}" for k in base.get_config().data
                  if k not in catalog.USER_DATA_READS)
# The data's shape: a built-in model reads these whatever the data.
SHAPE_KEYS = tuple(f"data.{k}" for k in dict.fromkeys(
    k for keys in catalog.SHAPE_KEYS.values() for k in keys))


def is_builtin(name: str) -> bool:
  return not imports.is_import_path(name)


def resolve(config, model_fn=None, dataset_fn=None):
  """(model_fn, dataset_fn): the functions given, else the ones
  config.model.name and config.data.name name.

  Raises:
    UserError: a name that is neither built in nor importable, a built-in
      that cannot take the config, or a setting that only a built-in reads
      while that side is the user's own (it would be ignored silently).
  """
  user_model = model_fn is not None or not is_builtin(config.model.name)
  user_data = dataset_fn is not None or not is_builtin(config.data.name)
  _refuse_unread_keys(config, user_model, user_data)
  if user_data:
    dataset_fn = dataset_fn or imports.load("data.name", config.data.name)
  if user_model:
    model_fn = model_fn or imports.load("model.name", config.model.name)
  if user_model and user_data:
    return model_fn, dataset_fn
  inputs = "" if user_model else catalog.MODELS[config.model.name].inputs
  if user_data:  # A built-in model reads the shape the config declares.
    spec = data.specs.declared(config.data, inputs)
  else:
    if user_model and config.data.name == data.SYNTHETIC:
      raise UserError(
          "data.name='synthetic' builds batches for a built-in model's "
          "inputs; with your own model, give it a dataset_fn of constant "
          "batches (tf.data.Dataset.from_tensors(batch).repeat()).")
    source = data.source(config.data, inputs)
    spec = source.spec
    dataset_fn = data.dataset_fn(source, data.Batching.from_config(config))
    # Its name, for the checks' messages (a user's model on it).
    dataset_fn.builtin_data = config.data.name
  if not user_model:
    model_fn = models.model_fn(config, spec)
  return model_fn, dataset_fn


def _refuse_unread_keys(config, user_model: bool, user_data: bool) -> None:
  defaults = base.get_config()
  unread = (MODEL_KEYS if user_model else ()) + tuple(
      k for k in (DATA_KEYS if user_data else ())
      if user_model or k not in SHAPE_KEYS)
  for key in unread:
    section, field = key.split(".")
    value, default = config[section][field], defaults[section][field]
    if value != default:
      side, what = (("model", "model") if key in MODEL_KEYS else
                    ("data", "dataset"))
      raise UserError(
          f"{key}={value!r} is a setting of the built-in {what}s, but "
          f"{side}.name={config[side].name!r} is your own: set it in your "
          f"{what}_fn, or leave {key} at its default ({default!r}).")
