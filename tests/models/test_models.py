"""Model registry, chrono initialisation, and saving."""
import os

import keras
import ml_collections
import numpy as np
import pytest

import helpers
from dist_keras import catalog, data, models, validate
from dist_keras.errors import UserError


def _build(config_name, **model_overrides):
  c = helpers.tiny_config(config_name)
  for key, value in model_overrides.items():
    setattr(c.model, key, value)
  spec = data.source(c.data).spec
  return models.build(c.model, spec), c


# Inputs of each kind a model reads (catalog.SHAPE_KEYS).
SPECS = {"images": data.InputSpec((32, 32, 1), "float32", 4),
         "tokens": data.InputSpec((12,), "int32", 4, 16),
         "per_token": data.InputSpec((12,), "int32", 16, 16, per_token=True)}


@pytest.mark.parametrize("name", list(catalog.MODELS))
def test_each_built_in_model_builds_from_the_keys_catalog_declares(name):
  """What catalog.py says a model reads is all a user may set for it (a
  key it does not read is refused: configs.refuse_unread), so it must
  build from those keys alone."""
  c = helpers.tiny_config().model
  c.name = name
  spec = SPECS[catalog.MODELS[name].inputs]
  model = models.build(ml_collections.ConfigDict(
      {k: c[k] for k in catalog.model_reads(name)}), spec)
  assert model.output_shape[-1] == spec.num_classes


@pytest.mark.parametrize("cell", ["lstm", "gru", "simple_rnn"])
def test_sequence_classifier_outputs_logits_per_class(cell):
  model, c = _build("lstm_longmem", cell=cell, num_layers=2)
  x = np.zeros((3, c.data.seq_len), np.int32)
  assert model(x).shape == (3, c.data.num_classes)
  recurrent = [l for l in model.layers if l.name.startswith(cell)]
  assert len(recurrent) == 2


def test_cnn_outputs_logits_per_class():
  model, c = _build("cnn_shapes")
  x = np.zeros((2, c.data.image_size, c.data.image_size, 1), np.float32)
  assert model(x).shape == (2, c.data.num_classes)


def test_lstm_chrono_bias_sets_forget_and_input_gates():
  model, c = _build("lstm_longmem")
  bias = model.get_layer("lstm_0").cell.bias.numpy()
  u = c.model.units
  forget, inputs = bias[u:2 * u], bias[:u]
  assert np.all(forget >= 0) and np.all(forget <= np.log(c.data.seq_len - 1))
  assert forget.std() > 0.1  # Spread over timescales, not a constant.
  np.testing.assert_allclose(inputs, -forget)
  np.testing.assert_array_equal(bias[2 * u:], 0.0)


def test_gru_chrono_bias_sets_update_gate_once():
  model, c = _build("lstm_longmem", cell="gru")
  bias = model.get_layer("gru_0").cell.bias.numpy()
  u = c.model.units
  assert np.all(bias[0, :u] > 0) and np.all(bias[1] == 0)


def test_chrono_off_keeps_keras_default_unit_forget_bias():
  model, c = _build("lstm_longmem", chrono_init=False)
  bias = model.get_layer("lstm_0").cell.bias.numpy()
  u = c.model.units
  np.testing.assert_array_equal(bias[u:2 * u], 1.0)


def test_model_keras_file_round_trips(tmp_path):
  model, c = _build("lstm_longmem")
  path = os.path.join(tmp_path, "m.keras")
  model.save(path)
  loaded = keras.models.load_model(path)
  x = np.arange(2 * c.data.seq_len).reshape(2, -1).astype(np.int32) % 16
  np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)


@pytest.mark.parametrize("config_name,key,value,message", [
    ("lstm_longmem", "name", "transformer", "model.name='transformer' is not"),
    ("lstm_longmem", "cell", "tcn", "model.cell='tcn' is not one of lstm"),
    ("cnn_shapes", "name", "sequence_classifier", "needs token inputs"),
])
def test_bad_model_settings_are_refused(config_name, key, value, message):
  c = helpers.tiny_config(config_name)
  setattr(c.model, key, value)
  with pytest.raises(UserError, match=message):  # At the door, else here.
    validate.config(c)
    models.build(c.model, data.source(c.data).spec)
