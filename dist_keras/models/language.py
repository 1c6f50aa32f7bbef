"""Character-level language model: Embedding -> stacked RNN -> Dense per step.

Predicts token t+1 from tokens <= t at every position, so its logits are
[batch, seq_len, vocab] and its labels [batch, seq_len] (InputSpec.per_token).
"""
import keras

from dist_keras.errors import UserError
from dist_keras.models import sequence


def check(model_cfg, input_spec) -> None:
  """Raises UserError for inputs or sizes this model cannot take."""
  if not (input_spec.per_token and input_spec.vocab_size):
    raise UserError("model.name='char_lm' needs per-token labels; use it with "
                    "data.name=tfds:tiny_shakespeare.")
  if model_cfg.cell not in sequence.CELLS:
    raise UserError(f"model.cell={model_cfg.cell!r} is not one of "
                    f"{', '.join(sequence.CELLS)}; pick one of those.")
  if model_cfg.num_layers < 1 or model_cfg.units < 1:
    raise UserError(f"model.num_layers={model_cfg.num_layers} and "
                    f"model.units={model_cfg.units} must be >= 1.")


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the LM: num_layers recurrent layers, all returning sequences."""
  seq_len = input_spec.shape[0]
  inputs = keras.Input(input_spec.shape, dtype="int32", name="tokens")
  x = keras.layers.Embedding(input_spec.vocab_size, model_cfg.embed_dim,
                             name="embedding")(inputs)
  for i in range(model_cfg.num_layers):
    x = sequence.recurrent(model_cfg, seq_len, return_sequences=True,
                           name=f"{model_cfg.cell}_{i}")(x)
  outputs = keras.layers.Dense(input_spec.num_classes, name="logits")(x)
  return keras.Model(inputs, outputs, name=f"{model_cfg.cell}_char_lm")
