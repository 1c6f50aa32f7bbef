"""Sequence classifier: Embedding -> stacked LSTM/GRU/SimpleRNN -> Dense."""
import keras
import numpy as np

from dist_keras.errors import UserError
from dist_keras import validate


def chrono_bias(cell: str, units: int, shape, max_timescale: int):
  """Chrono initialisation of gate biases (Tallec & Ollivier, ICLR 2018).

  The forget gate's bias is log(U(1, max_timescale - 1)) per unit, so units
  start out remembering over timescales up to the sequence length instead of
  Keras' default ~1-2 steps; the LSTM input gate gets the negated bias. With
  the default init a Keras LSTM(64) sat at chance on the 50-token
  first-token task for 250 to all 800 steps, depending on the seed; with
  this it climbs from step 100 and reaches 95% at 350-400 (docs/configs.md).

  Bias layouts: LSTM [i, f, c, o]; GRU [z, r, h] per row, where z plays the
  forget gate (h = z * h_prev + (1 - z) * candidate in Keras). Draws from
  NumPy's global RNG, which keras.utils.set_random_seed seeds.
  """
  rng = np.random.default_rng(np.random.randint(2**31))
  timescales = rng.uniform(1.0, max(max_timescale - 1, 1.0), units)
  keep = np.log(timescales).astype("float32")
  bias = np.zeros(shape, dtype="float32")
  if cell == "lstm":
    bias[units:2 * units] = keep  # forget gate
    bias[:units] = -keep  # input gate
  elif len(shape) == 2:  # gru, reset_after: rows (input, recurrent) bias.
    bias[0, :units] = keep  # update gate z (the two rows are summed)
  else:
    bias[:units] = keep
  return bias


def set_chrono_bias(layer, seq_len: int) -> None:
  """Writes chrono_bias into a built LSTM/GRU layer's gate biases.

  Assigned after building rather than passed as a custom initializer, so
  the saved model.keras names only Keras' own classes and loads with
  `keras.models.load_model` alone.
  """
  bias = layer.cell.bias
  cell = "lstm" if isinstance(layer, keras.layers.LSTM) else "gru"
  bias.assign(chrono_bias(cell, layer.cell.units, tuple(bias.shape), seq_len))


def check(model_cfg, input_spec) -> None:
  """Raises UserError for a cell or input this model cannot take."""
  if not input_spec.vocab_size or input_spec.per_token:
    raise UserError("model.name='sequence_classifier' needs token inputs "
                    "with one label each; use it with data.name=longmem or "
                    "tfds:imdb_reviews.")
  check_stack(model_cfg)


def check_stack(model_cfg) -> None:
  """Raises UserError for a cell the recurrent stack cannot take (its sizes:
  validate.py)."""
  validate.check_choice("model.cell", model_cfg.cell, validate.CELLS)


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the classifier; `model_cfg.cell` picks the recurrent layer."""
  inputs, x = token_stack(model_cfg, input_spec, last_sequences=False)
  outputs = keras.layers.Dense(input_spec.num_classes, name="logits")(x)
  return keras.Model(inputs, outputs, name=f"{model_cfg.cell}_classifier")


def token_stack(model_cfg, input_spec, last_sequences: bool):
  """(inputs, outputs) of Embedding -> num_layers recurrent layers.

  Every layer but the last returns its sequence; the last one does too if
  `last_sequences` (a per-token model), else only its final state.
  """
  seq_len = input_spec.shape[0]
  inputs = keras.Input(input_spec.shape, dtype="int32", name="tokens")
  x = keras.layers.Embedding(input_spec.vocab_size, model_cfg.embed_dim,
                             name="embedding")(inputs)
  for i in range(model_cfg.num_layers):
    last = i == model_cfg.num_layers - 1
    layer = recurrent(model_cfg, return_sequences=last_sequences or not last,
                      name=f"{model_cfg.cell}_{i}")
    x = layer(x)
    if model_cfg.chrono_init and model_cfg.cell != "simple_rnn":
      set_chrono_bias(layer, seq_len)
  return inputs, x


def recurrent(model_cfg, return_sequences: bool, name: str):
  """One `model_cfg.cell` layer (its chrono biases are set once built)."""
  kwargs = {"return_sequences": return_sequences, "name": name}
  if model_cfg.cell == "simple_rnn":
    # No gates to initialise; an orthogonal recurrent kernel is what lets a
    # vanilla RNN carry a signal at all (its default too, stated for clarity).
    kwargs["recurrent_initializer"] = "orthogonal"
  elif model_cfg.chrono_init and model_cfg.cell == "lstm":
    kwargs["unit_forget_bias"] = False  # The chrono bias replaces it.
  cell = getattr(keras.layers, validate.CELLS[model_cfg.cell])
  return cell(model_cfg.units, **kwargs)
