"""Counts the collective all-reduce ops runtime.bytes_per_pack yields.

  python tests/scripts/pack_ops.py 0 512 4096   # -> JSON on stdout

Packing is TF's collective implementation's (CollectiveAllReduce, what
MultiWorkerMirroredStrategy uses); MirroredStrategy on CPUs reduces to one
device and ignores it. So this builds the collective strategy over this
process's 2 logical CPU devices (TF's own local-devices constructor, as its
tests do) and, per bytes_per_pack, traces allreduce.all_reduce_gradients of
four 1 KB gradients, counts the CollectiveReduceV2 ops per device and runs
it once (the sums must not change). Its own process: collective ops are
configured once per process.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from dist_keras.training import allreduce  # pylint: disable=g-import-not-at-top

DEVICES = 2
GRADIENTS = 4  # Of 256 float32 each: 1 KB.


def packs_and_sums(strategy, bytes_per_pack: int):
  @tf.function
  def step():
    def replica():
      grads = [tf.fill([256], float(i)) for i in range(GRADIENTS)]
      return allreduce.all_reduce_gradients(grads,
                                            bytes_per_pack=bytes_per_pack)
    return strategy.run(replica)

  graph = step.get_concrete_function().graph
  ops = [op.type for op in graph.get_operations()] + [
      n.op for f in graph.as_graph_def().library.function for n in f.node_def]
  sums = [float(strategy.experimental_local_results(g)[0].numpy()[0])
          for g in step()]
  return ops.count("CollectiveReduceV2") // DEVICES, sums


def main(sizes):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * DEVICES)
  strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(  # pylint: disable=protected-access
      [f"/cpu:{i}" for i in range(DEVICES)])
  out = {}
  for size in sizes:
    packs, sums = packs_and_sums(strategy, size)
    out[size] = {"packs": packs, "sums": sums}
  print(json.dumps(out))


if __name__ == "__main__":
  main([int(a) for a in sys.argv[1:]])
