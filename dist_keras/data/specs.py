"""What a model reads: the InputSpec every source states, and the one a
config declares for data that is not built in (a user's dataset_fn, or
data.name=synthetic, which builds batches of the declared shape).

No TensorFlow here: the sources, registry.py and models/ read it.
"""
import dataclasses

from dist_keras.catalog import SHAPE_KEYS
from dist_keras.errors import UserError

# What a model reads (catalog.MODELS' inputs).
INPUT_KINDS = tuple(SHAPE_KEYS)


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """What a model needs to know about its inputs."""
  shape: tuple
  dtype: str
  num_classes: int
  vocab_size: int = 0  # Token inputs only.
  # Labels are one class per input token ([batch, seq_len]), e.g. a language
  # model: the loss and accuracy are per token and perplexity is exp(loss).
  per_token: bool = False

  @property
  def kind(self) -> str:
    """The model inputs (INPUT_KINDS) this spec describes."""
    return ("per_token" if self.per_token else "tokens" if self.vocab_size
            else "images")


def declared_keys(spec: InputSpec) -> dict:
  """{data config key: value} that describe `spec` (SHAPE_KEYS)."""
  if spec.kind == "images":
    return {"image_size": spec.shape[0], "channels": spec.shape[2],
            "num_classes": spec.num_classes}
  return {"seq_len": spec.shape[0], "vocab_size": spec.vocab_size,
          "num_classes": spec.num_classes}


def declared(data_cfg, inputs: str) -> InputSpec:
  """The InputSpec of the data `data_cfg` declares (data.image_size,
  channels, num_classes; data.seq_len, vocab_size, num_classes) for a model
  reading `inputs` (INPUT_KINDS); raises UserError for sizes below 1."""
  if inputs not in INPUT_KINDS:
    raise ValueError(f"data.name={data_cfg.name} needs the model's inputs, "
                     f"one of {INPUT_KINDS} (catalog.MODELS), not {inputs!r}.")
  for key in SHAPE_KEYS[inputs]:
    if getattr(data_cfg, key) < 1:
      raise UserError(f"data.{key}={getattr(data_cfg, key)} must be >= 1 for "
                      f"data.name={data_cfg.name}, which builds the inputs "
                      f"the config declares: set the real data's {key}.")
  if inputs == "images":
    size = data_cfg.image_size
    return InputSpec((size, size, data_cfg.channels), "float32",
                     data_cfg.num_classes)
  return InputSpec((data_cfg.seq_len,), "int32", data_cfg.num_classes,
                   data_cfg.vocab_size, per_token=inputs == "per_token")
