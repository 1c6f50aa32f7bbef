"""A vanilla SimpleRNN on the default long-memory task, for contrast.

Run:    python -m dist_keras.train --config=configs/rnn_longmem.py
Result: see the README configs table (measured on the 2-core CPU machine).
"""
from configs import lstm_longmem


def get_config():
  c = lstm_longmem.get_config()
  c.model.cell = "simple_rnn"
  return c
