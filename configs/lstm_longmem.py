"""Default: LSTM remembers the first token of a 50-token sequence.

Run:    python -m dist_keras.train --config=configs/lstm_longmem.py
Result: see the README configs table (measured on the 2-core CPU machine).
"""
from configs import base


def get_config():
  c = base.get_config()
  c.model.cell = "lstm"
  return c
