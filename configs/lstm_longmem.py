"""Default: an LSTM must remember the first of 50 tokens (the `longmem` task).

Run:    python -m dist_keras.train --config=lstm_longmem
        (or just `python -m dist_keras.train`)
Result: 2 logical CPU replicas on the 2-core CPU machine, global batch 256:
        800 steps in 35 s (46 s under pytest), eval accuracy 1.000 for seeds
        0, 1 and 2; 95% is reached at 350-400 steps (seeds 0-2, 2026-12-06).
        Without the chrono gate biases (model.chrono_init=False) seed 0
        sits at chance for all 800 steps (0.260 at the end), and seeds 1
        and 2 wait at chance for 450 and 250 steps before learning it
        (1.000): see tools/grid.py and docs/configs.md.
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.model.cell = "lstm"
  return c
