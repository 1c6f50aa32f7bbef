"""Writes the ids of the eval examples this process's replicas evaluate.

  python tests/scripts/eval_ids.py --out=ids{task}.npy [--eval_size=123]

Run under tools/launch_local.py for multi-worker: each worker writes the ids
(weight 1, i.e. not padding) its replicas got in one pass of the eval split.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/, for helpers (this folder is on the path as the script's own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import helpers  # pylint: disable=g-import-not-at-top
from dist_keras.distribute import pipelines
from dist_keras.distribute import strategies
from dist_keras.distribute import tfconfig


def evaluated_ids(strategy, config):
  """Ids of the examples every local replica got in one eval pass, through
  the loop's own distribution of the built-in eval split (replicas that run
  out of data get empty batches)."""
  ids = []
  fn = helpers.builtin_dataset_fn(config, with_ids=True)
  dataset, _ = pipelines.distribute(
      strategy, fn, "eval", pipelines.Feed(config.train.global_batch_size,
                                           config.data.pipeline_per_replica),
      eval_steps=config.eval.steps)
  for batch in dataset:
    for _, _, i in zip(*[strategy.experimental_local_results(t)
                         for t in batch]):
      ids.extend(i.numpy().tolist())
  return np.array(ids, np.int64)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--eval_size", type=int, default=123)
  parser.add_argument("--global_batch_size", type=int, default=32)
  args = parser.parse_args()
  c = helpers.tiny_config()
  c.data.eval_size = args.eval_size
  c.train.global_batch_size = args.global_batch_size
  strategy = strategies.get_strategy(c.runtime)
  ids = evaluated_ids(strategy, c)
  cluster = tfconfig.from_env()
  np.save(args.out.format(task=cluster.task_index if cluster else 0), ids)
  helpers.leave_as_fit_does()


if __name__ == "__main__":
  main()
