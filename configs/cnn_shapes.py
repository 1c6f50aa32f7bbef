"""CNN on the built-in 32x32 shapes images (square, circle, triangle, cross).

Run:    python -m dist_keras.train --config=configs/cnn_shapes.py
Result: see the README configs table (measured on the 2-core CPU machine).
"""
from configs import base


def get_config():
  c = base.get_config()
  c.data.name = "shapes"
  c.model.name = "cnn"
  c.model.filters = (16, 32)
  c.train.learning_rate = 1e-3
  c.train.steps = 400
  return c
