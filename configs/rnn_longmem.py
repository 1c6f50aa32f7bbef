"""A vanilla SimpleRNN on the default long-memory task, for contrast.

Run:    python -m dist_keras.train --config=rnn_longmem
Result: 2 logical CPU replicas on the 2-core CPU machine: 800 steps in
        17-25 s, eval accuracy 1.000 for seeds 0, 1, 2 (95% at ~100 steps,
        faster than the LSTM at T=50). With --config.data.seq_len=200 it
        stays at chance (0.247 after 1,000 steps, seed 0) while the LSTM
        reaches 0.998: see tools/grid.py and docs/configs.md.
"""
from dist_keras.configs import lstm_longmem


def get_config():
  c = lstm_longmem.get_config()
  c.model.cell = "simple_rnn"
  return c
