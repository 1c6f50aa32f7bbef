"""CNN image classifier: conv blocks (conv, conv, max-pool) -> dense head.

No batch normalisation on purpose: per-replica batch statistics would make
N-replica training differ from one device, and the equivalence tests hold
the loop to 1e-5.
"""
import keras

from dist_keras.errors import UserError


def check(model_cfg, input_spec) -> None:
  """Raises UserError for inputs this model cannot take (its filters:
  validate.py)."""
  if len(input_spec.shape) != 3:
    raise UserError("model.name='cnn' needs image inputs; use it with "
                    "data.name=shapes or a TFDS image dataset (tfds:mnist).")


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the CNN; one block of two 3x3 convs + 2x2 pool per filter count."""
  inputs = keras.Input(input_spec.shape, dtype="float32", name="image")
  x = inputs
  for i, filters in enumerate(model_cfg.filters):
    for j in range(2):
      x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu",
                              name=f"block{i}_conv{j}")(x)
    x = keras.layers.MaxPooling2D(2, name=f"block{i}_pool")(x)
  x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
  x = keras.layers.Dense(model_cfg.dense_units, activation="relu",
                         name="dense")(x)
  outputs = keras.layers.Dense(input_spec.num_classes, name="logits")(x)
  return keras.Model(inputs, outputs, name="cnn_classifier")
