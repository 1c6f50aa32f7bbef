"""Trains both models 10 SGD steps and saves their weights (for equivalence).

  python tests/scripts/train_weights.py --strategy=mirrored --devices=4 --out=w.npz

Run as its own process: a process can hold only one replica count. Under
tools/launch_local.py with --strategy=multi_worker_mirrored every worker
writes its own file: `{task}` in --out becomes its TF_CONFIG task index.
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/, for helpers (this folder is on the path as the script's own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import helpers  # pylint: disable=g-import-not-at-top
import user_task  # pylint: disable=g-import-not-at-top
from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top
from dist_keras.distribute import tfconfig
from dist_keras.configs import base  # pylint: disable=g-import-not-at-top


EVAL_SIZE = 123


# A user's model (tests/user_task.py: L2 regularisers, sample weights, SGD,
# its own eval split of 123 examples) through the command line's names.
USER = "user"
MODELS = ("lstm_longmem", "cnn_shapes", USER)


def _config(config_name, global_batch_size, pipeline_per_replica):
  if config_name == USER:
    c = base.get_config()  # Built-in model and data settings unset.
    c.model.name, c.data.name = "user_task:model_fn", "user_task:dataset_fn"
    c.train.log_every = c.train.checkpoint_every = 4
    c.log.progress, c.log.calibration_steps = False, 0
  else:
    c = helpers.tiny_config(config_name)
    c.train.optimizer, c.train.learning_rate = "sgd", 2.0
    # Small enough to clip every step: clipping must see the GLOBAL gradient.
    c.train.global_clipnorm = 0.05
    # Not divisible by any global batch or replica count: eval must still
    # see every example exactly once.
    c.data.eval_size = EVAL_SIZE
  c.train.steps, c.train.global_batch_size = 10, global_batch_size
  if config_name == USER:  # Its dataset_fn batches for this global batch.
    c.train.global_batch_size = user_task.GLOBAL_BATCH
  c.data.pipeline_per_replica = pipeline_per_replica
  c.eval.every = 0
  return c


def models_after_training(models, strategy, global_batch_size=32,
                          pipeline_per_replica=False) -> dict:
  """weights_after_training of each of `models`, in one dict."""
  weights = {}
  for name in models:
    weights.update(weights_after_training(name, strategy, global_batch_size,
                                          pipeline_per_replica))
  return weights


def weights_after_training(config_name, strategy, global_batch_size=32,
                           pipeline_per_replica=False):
  c = _config(config_name, global_batch_size, pipeline_per_replica)
  with tempfile.TemporaryDirectory() as workdir:
    trainer = helpers.trainer(c, workdir, strategy)
    initial = {f"initial/{k}": v
               for k, v in _weights(config_name, trainer.model).items()}
    summary = trainer.run()
    trainer.close()
    # eval_examples, eval_loss, then the compiled metric (accuracy, mae).
    metric = "eval_mae" if config_name == USER else "eval_accuracy"
    evaluated = np.array([summary["eval_examples"], summary["eval_loss"],
                          summary[metric]])
    return {**initial, f"eval/{config_name}": evaluated,
            **_weights(config_name, trainer.model)}


def _weights(config_name, model) -> dict:
  """{NAME/INDEX/LEAF: value}: layer names depend on what the process
  built before (a test process builds many), so weights match by position."""
  return {f"{config_name}/{i}/{w.path.split('/')[-1]}": w.numpy()
          for i, w in enumerate(model.weights)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--strategy", required=True)
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--global_batch_size", type=int, default=32)
  parser.add_argument("--pipeline_per_replica", action="store_true")
  parser.add_argument("--models", default=",".join(MODELS))
  # Also the ids of the eval examples this process's replicas evaluate
  # (eval_ids.py's pass of 123 examples in --global_batch_size batches),
  # from the same cluster: a multi-worker test reads both without
  # starting another.
  parser.add_argument("--eval_ids_out")
  args = parser.parse_args()
  c = helpers.tiny_config()
  c.runtime.strategy, c.runtime.num_cpu_devices = args.strategy, args.devices
  strategy = strategies.get_strategy(c.runtime)
  assert strategy.num_replicas_in_sync == (
      1 if args.strategy == "one_device" else args.devices)
  weights = models_after_training(args.models.split(","), strategy,
                                  args.global_batch_size,
                                  args.pipeline_per_replica)
  cluster = tfconfig.from_env()
  task = cluster.task_index if cluster else 0
  np.savez(args.out.format(task=task), **weights)
  if args.eval_ids_out:
    import eval_ids  # pylint: disable=g-import-not-at-top
    ids_config = helpers.tiny_config()
    ids_config.data.eval_size = EVAL_SIZE
    ids_config.train.global_batch_size = args.global_batch_size
    np.save(args.eval_ids_out.format(task=task),
            eval_ids.evaluated_ids(strategy, ids_config))
  helpers.leave_as_fit_does()


if __name__ == "__main__":
  main()
