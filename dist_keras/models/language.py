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
  sequence.check_stack(model_cfg)


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the LM: num_layers recurrent layers, all returning sequences."""
  inputs, x = sequence.token_stack(model_cfg, input_spec, last_sequences=True)
  outputs = keras.layers.Dense(input_spec.num_classes, name="logits")(x)
  return keras.Model(inputs, outputs, name=f"{model_cfg.cell}_char_lm")
