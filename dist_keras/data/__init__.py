"""Dataset registry and the per-replica input pipeline.

Builders return unbatched examples of one split, already sharded by input
pipeline; this module batches them per replica and hands them to the strategy.
"""
import dataclasses
from typing import Callable

import tensorflow as tf

from dist_keras.data import synthetic
from dist_keras.errors import UserError


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """What a model needs to know about its inputs."""
  shape: tuple
  dtype: str
  num_classes: int
  vocab_size: int = 0  # Token inputs only.


_BUILDERS: dict[str, Callable] = {
    "longmem": synthetic.longmem,
    "shapes": synthetic.shapes,
}


def input_spec(data_cfg) -> InputSpec:
  """The InputSpec of the dataset `data_cfg.name`."""
  _check(data_cfg)
  if data_cfg.name == "longmem":
    return InputSpec((data_cfg.seq_len,), "int32", data_cfg.num_classes,
                     data_cfg.vocab_size)
  size = data_cfg.image_size
  return InputSpec((size, size, 1), "float32", data_cfg.num_classes)


def _check(data_cfg):
  if data_cfg.name not in _BUILDERS:
    raise UserError(f"data.name={data_cfg.name!r} is not one of "
                    f"{', '.join(sorted(_BUILDERS))}; pick one of those.")
  synthetic.check(data_cfg, data_cfg.name)


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
  """global / replicas; raises UserError unless it divides exactly."""
  if global_batch_size < 1:
    raise UserError(f"train.global_batch_size={global_batch_size} must be "
                    ">= 1.")
  if global_batch_size % num_replicas:
    raise UserError(
        f"train.global_batch_size={global_batch_size} is not divisible by "
        f"the {num_replicas} replicas; use a multiple of {num_replicas}.")
  return global_batch_size // num_replicas


def dataset_fn(data_cfg, split: str, global_batch_size: int, seed: int,
               steps: int = 0):
  """The `(InputContext) -> tf.data.Dataset` for one split.

  Train: cached, shuffled with `seed`, repeated, per-replica batches with
  static shapes. Eval: one pass over the split in order, per-replica batches
  (the last partial batch is dropped), at most `steps` global batches.
  """
  _check(data_cfg)
  build = _BUILDERS[data_cfg.name]

  def make(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch_size)
    ds = build(data_cfg, split, seed, ctx).cache()
    if split == "train":
      ds = ds.shuffle(data_cfg.shuffle_buffer, seed=seed,
                      reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch, drop_remainder=True)
    if split != "train" and steps > 0:
      # Each pipeline feeds num_replicas_in_sync / num_input_pipelines replicas.
      per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
      ds = ds.take(steps * per_pipeline)
    return ds.prefetch(tf.data.AUTOTUNE)

  return make


def distribute(strategy, data_cfg, split, global_batch_size, seed, steps=0):
  """A distributed dataset of `split` for `strategy`'s replicas."""
  per_replica_batch_size(global_batch_size, strategy.num_replicas_in_sync)
  fn = dataset_fn(data_cfg, split, global_batch_size, seed, steps)
  options = None
  if data_cfg.pipeline_per_replica:
    # Per-replica pipelines are built on the host; TensorFlow refuses to
    # prefetch them to the devices itself.
    options = tf.distribute.InputOptions(
        experimental_replication_mode=(
            tf.distribute.InputReplicationMode.PER_REPLICA),
        experimental_fetch_to_device=False)
  # distribute_datasets_from_function never auto-shards: `fn` shards by
  # input_pipeline_id at the source, so every worker reads its own examples.
  return strategy.distribute_datasets_from_function(fn, options)
