"""The built-in models and datasets by name: what builds each, the inputs it
reads or makes, and the keys of its config section it reads, declared once,
here.

Nothing imported (no TensorFlow): the config's checks read it before
TensorFlow starts (validate.py, the names; configs, a key the user set that
the chosen model or data does not read), and models/ and data/ act on it.
Tests build each built-in from the keys declared here alone
(tests/models/test_models.py, tests/data/test_data.py and test_tfds.py):
one that reads another key fails there.
"""
import re
import typing


class Builtin(typing.NamedTuple):
  """A built-in model or dataset."""
  module: str  # A model's module in dist_keras/models ("" for data).
  # What a model reads, or the data make: images | tokens | per_token
  # (tokens with one label each); "": the model's (data.name=synthetic).
  inputs: str
  # The keys of its config section it reads (data: besides DATA_SHARED and
  # the SHAPE_KEYS of its inputs).
  reads: tuple


_RECURRENT = ("cell", "embed_dim", "units", "num_layers", "chrono_init")
# model.name -> the built-in model. Any other name is a user's PKG.MODULE:FN.
MODELS = {
    "char_lm": Builtin("language", "per_token", ("name", *_RECURRENT)),
    "cnn": Builtin("cnn", "images", ("name", "filters", "dense_units")),
    "resnet50": Builtin("resnet", "images", ("name",)),
    "sequence_classifier": Builtin("sequence", "tokens",
                                   ("name", *_RECURRENT)),
}
# The data's shape, by the inputs a model reads: built-in data read those of
# the inputs they make (to make them, or to warn that the config declares
# another shape); a built-in model reads them for data it does not know (a
# user's dataset_fn, data.name=synthetic).
SHAPE_KEYS = {"images": ("image_size", "channels", "num_classes"),
              "tokens": ("seq_len", "vocab_size", "num_classes"),
              "per_token": ("seq_len", "vocab_size", "num_classes")}
# What a user's dataset_fn reads (registry.py refuses the other data.* keys
# then), and what every built-in dataset reads.
USER_DATA_READS = ("name", "pipeline_per_replica")
DATA_SHARED = (*USER_DATA_READS, "prefetch", "threads")
# data.name -> the built-in data, besides tfds:NAME: the generated datasets
# (each a function of dist_keras/data/generated.py), and constant batches
# shaped like the model's inputs. Any other name is a user's PKG.MODULE:FN.
GENERATED = {
    "longmem": Builtin("", "tokens", ("train_size", "eval_size",
                                      "shuffle_buffer")),
    "shapes": Builtin("", "images", ("train_size", "eval_size", "noise",
                                     "shuffle_buffer")),
}
SYNTHETIC = "synthetic"
DATASETS = {**GENERATED, SYNTHETIC: Builtin("", "", ("eval_size",))}
TFDS_PREFIX = "tfds:"  # tfds:NAME names any TFDS dataset, not a module.
# tfds:NAME -> how data/tfds_sources.py reads it; any NAME not here is an
# image classification dataset.
TFDS_KINDS = {"imagenet2012": "imagenet", "imdb_reviews": "text",
              "tiny_shakespeare": "chars"}
_TFDS_READS = ("data_dir", "download", "shuffle_buffer")
TFDS = {kind: Builtin("", inputs, _TFDS_READS) for kind, inputs in (
    ("image", "images"), ("imagenet", "images"), ("text", "tokens"),
    ("chars", "per_token"))}


def tfds_dataset(name: str) -> str:
  """'tfds:imdb_reviews/plain_text:1.0.0' -> 'imdb_reviews'."""
  return re.split(r"[/:]", name[len(TFDS_PREFIX):])[0]


def tfds_kind(name: str) -> str:
  """How tfds:NAME's examples are read: image | imagenet | text | chars."""
  return TFDS_KINDS.get(tfds_dataset(name), "image")


def model_reads(name: str) -> tuple | None:
  """The model.* keys built-in model `name` reads; None for any other."""
  model = MODELS.get(name)
  return model.reads if model else None


def data_reads(name: str, model_inputs: str = "") -> tuple | None:
  """The data.* keys built-in data `name` reads, for a model reading
  `model_inputs` (what data.name=synthetic makes); None for any other name,
  or for synthetic data without a built-in model's inputs."""
  data = (TFDS[tfds_kind(name)] if name.startswith(TFDS_PREFIX)
          else DATASETS.get(name))
  inputs = data and (data.inputs or model_inputs)
  if not inputs:
    return None
  return (*DATA_SHARED, *SHAPE_KEYS[inputs], *data.reads)


def unread(config, user_set: dict) -> str | None:
  """The line refusing the first key of `user_set` ({"section.key": how
  the user set it}) that the config's built-in model or data does not read:
  it would be ignored. None if each is read, or is a user's model's or
  data's to read (registry.py refuses the built-ins' keys there)."""
  model = MODELS.get(config.model.name)
  inputs = model.inputs if model else ""
  reads = {"model": model_reads(config.model.name),
           "data": data_reads(config.data.name, inputs)}
  for key, how in user_set.items():
    section, _, field = key.partition(".")
    if reads.get(section) is None or field in reads[section]:
      continue
    own = [f"{section}.{k}" for k in reads[section]
           if k not in ("name", *DATA_SHARED)]
    others = _readers(section, field, inputs)
    return (f"{how}: {section}.name={config[section].name!r} does not read "
            f"{key} (it reads {', '.join(own) or 'none of ' + section + '.*'})"
            "; drop it" + (f", or set {section}.name to one that reads it: "
                           f"{', '.join(others)}" if others else "") + ".")
  return None


def _readers(section: str, field: str, model_inputs: str) -> list:
  """The built-in models, or data (for a model reading `model_inputs`),
  that read `field` of `section`."""
  if section == "model":
    return [name for name, model in MODELS.items() if field in model.reads]
  found = [name for name in DATASETS
           if field in (data_reads(name, model_inputs) or ())]
  if any(field in (*SHAPE_KEYS[t.inputs], *t.reads) for t in TFDS.values()):
    found.append(f"{TFDS_PREFIX}NAME")
  return found
