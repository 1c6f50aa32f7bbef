"""Trains both models 10 SGD steps and saves their weights (for equivalence).

  python tests/train_weights.py --strategy=mirrored --devices=4 --out=w.npz

Run as its own process: a process can hold only one replica count.
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import helpers  # pylint: disable=g-import-not-at-top
from dist_keras import loop, strategy as strategy_lib  # pylint: disable=g-import-not-at-top


def weights_after_training(config_name, strategy):
  c = helpers.tiny_config(config_name)
  c.train.optimizer, c.train.learning_rate = "sgd", 2.0
  # Small enough to clip every step: clipping must see the GLOBAL gradient.
  c.train.global_clipnorm = 0.05
  c.train.steps, c.train.global_batch_size = 10, 32
  c.eval.every = 0
  with tempfile.TemporaryDirectory() as workdir:
    trainer = loop.Trainer(c, workdir, strategy)
    initial = {f"initial/{config_name}/{w.path}": w.numpy()
               for w in trainer.model.weights}
    trainer.run()
    return {**initial, **{f"{config_name}/{w.path}": w.numpy()
                          for w in trainer.model.weights}}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--strategy", required=True)
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  c = helpers.tiny_config()
  c.runtime.strategy, c.runtime.num_cpu_devices = args.strategy, args.devices
  strategy = strategy_lib.get_strategy(c.runtime)
  assert strategy.num_replicas_in_sync == (
      1 if args.strategy == "one_device" else args.devices)
  weights = {}
  for name in ("lstm_longmem", "cnn_shapes"):
    weights.update(weights_after_training(name, strategy))
  np.savez(args.out, **weights)


if __name__ == "__main__":
  main()
