"""Writes a real profiler trace of a 2-replica all-reduce (run as a script).

  python tests/scripts/make_trace.py LOGDIR [--steps=5] [--megabytes=4]
      [--straggle_ms=0] [--no_markers]

Splits the CPU into 2 logical devices (before TensorFlow initialises, hence a
process of its own), then profiles `--steps` steps of a tf.function that
SUM-all-reduces `--megabytes` of float32 per replica under MirroredStrategy,
each step inside a `tf.profiler.experimental.Trace("train", step_num=n,
_r=1)` marker, as the training loop does. Replica r sleeps r * straggle_ms
before the all-reduce, so replica 0 waits for replica 1 by a known amount.
Prints {"devices": {node name: device}, "step_nums": [...]} as JSON.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from dist_keras.distribute import cpus  # pylint: disable=g-import-not-at-top,wrong-import-position

cpus.split_cpu(2)

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from dist_keras.measure import trace  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("logdir")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--megabytes", type=float, default=4.0)
  p.add_argument("--straggle_ms", type=float, default=0.0)
  p.add_argument("--no_markers", action="store_true")
  return p.parse_args(argv)


def make_step(strategy, num_floats: int, straggle_ms: float):
  """A tf.function: every replica all-reduces `num_floats` float32s."""

  def straggle(replica_id):
    time.sleep(float(replica_id) * straggle_ms / 1e3)
    return replica_id

  def replica_fn():
    ctx = tf.distribute.get_replica_context()
    replica_id = tf.identity(ctx.replica_id_in_sync_group)
    if straggle_ms:  # The sleep must finish before the all-reduce starts.
      replica_id = tf.py_function(straggle, [replica_id], tf.int32)
    values = tf.fill([num_floats], tf.cast(replica_id, tf.float32) + 1.0)
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)[:1]

  @tf.function
  def step():
    return strategy.run(replica_fn)

  return step


def main(argv=None):
  args = parse_args(argv)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  step = make_step(strategy, int(args.megabytes * 2**20 / 4), args.straggle_ms)
  step()  # Tracing and collective group set-up stay out of the profile.
  step_nums = list(range(1, args.steps + 1))
  tf.profiler.experimental.start(args.logdir)
  for n in step_nums:
    if args.no_markers:
      step()
    else:
      with tf.profiler.experimental.Trace("train", step_num=n, _r=1):
        step()
  # One unmarked step more: the last marked step's collective events are
  # recorded just after its call returns and would race with stop().
  step()
  tf.profiler.experimental.stop()
  devices = trace.collective_devices(step.get_concrete_function().graph)
  print(json.dumps({"devices": devices, "step_nums": step_nums}))


if __name__ == "__main__":
  main()
