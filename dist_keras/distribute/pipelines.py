"""The per-replica input pipelines: a dataset_fn's datasets, checked and
handed to the strategy with `distribute_datasets_from_function`."""
import contextlib
import dataclasses
import warnings

import tensorflow as tf

from dist_keras import origins
from dist_keras.contract import (batches, checks, class_weights, imports,
                                 xla_limits)
from dist_keras.errors import UserError

# Iterating a distributed dataset inside tf.function reads its options in
# graph mode, which warns on every eval trace; the behaviour is intended.
warnings.filterwarnings(
    "ignore", message="To make it possible to preserve tf.data options")


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


@dataclasses.dataclass(frozen=True)
class Feed:
  """How the pipelines feed the replicas: the global batch, and whether
  each replica has its own pipeline (data.pipeline_per_replica) instead of
  one per worker, and the class weights of the train batches."""
  global_batch_size: int
  per_replica_pipelines: bool = False
  class_weight: tuple = ()  # train.class_weight: the train split's.

  @classmethod
  def from_config(cls, config) -> "Feed":
    return cls(config.train.global_batch_size,
               config.data.pipeline_per_replica,
               tuple(config.train.class_weight))


def distribute(strategy, dataset_fn, split: str, feed: Feed,
               start_step: int = 0, eval_steps: int = 0):
  """`dataset_fn`'s pipelines of `split` for the strategy's replicas, and
  their element spec.

  Each pipeline's dataset is checked against the contract; the train
  stream skips the `start_step` steps already trained (every pipeline
  feeds num_replicas / num_pipelines batches per step); eval stops after
  `eval_steps` steps when set. One pipeline per replica (Feed) makes one
  process read exactly what N one-replica workers read. An eval split of
  None from every pipeline is no eval split, as Keras' fit without
  validation_data: (None, None).
  """
  checks.check_signature(dataset_fn, "dataset_fn", ("split", "input_context"))
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  xla_limits.check_tpu_pipelines(feed.per_replica_pipelines, on_tpu)
  replicas = strategy.num_replicas_in_sync
  global_batch_size = feed.global_batch_size
  per_replica_batch_size(global_batch_size, replicas)
  class_weights.check(feed.class_weight)
  specs, sizes = [], []  # sizes: (pipelines, that one's batches).
  nones = []  # The pipelines whose eval split is None (no eval split).

  def make(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    with origins.raised_in(f"dataset_fn({split!r}, ...) "
                           f"{imports.name_of(dataset_fn)}"):
      ds = dataset_fn(split, ctx)
    if split == "eval" and (ds is None or nones):
      return _no_eval_split(ds, ctx, nones, specs)
    batches.check_dataset(ds, split, global_batch_size, replicas, eval_steps,
                          ctx)
    xla_limits.check_tpu_batches(ds.element_spec, split, on_tpu)
    if split == "train" and feed.class_weight:
      ds = class_weights.weighed(ds, feed.class_weight)
    specs.append(ds.element_spec)
    sizes.append((ctx.num_input_pipelines, int(ds.cardinality())))
    per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
    if split == "train" and start_step:
      ds = ds.skip(start_step * per_pipeline)
    if split == "eval" and eval_steps:
      ds = ds.take(eval_steps * per_pipeline)
    return _nones_filled(ds) if split == "eval" else ds

  if reads_on_host(strategy):
    # The dataset itself, as Keras' fit reads it with no strategy: a
    # distributed dataset would move each batch to the device it is already
    # on through a multi-device iterator and its own prefetch thread.
    ds = make(tf.distribute.InputContext())
    return (None, None) if nones else (ds, specs[0])
  # distribute_datasets_from_function never auto-shards: each pipeline
  # reads the shard its dataset_fn picks by input_pipeline_id.
  with _input_devices_kept(strategy), _whole_batches(strategy, split):
    dataset = strategy.distribute_datasets_from_function(
        make, _input_options(feed))
  if nones:
    return None, None
  if split == "eval":
    _check_some_eval_batches(sizes)
  return dataset, specs[0]


def _input_options(feed: Feed):
  """The InputOptions of the feed's pipelines (None: one per worker)."""
  if not feed.per_replica_pipelines:
    return None
  # Batches stay on the host, where each replica's pipeline runs (TF 2.21
  # would also prefetch them to the devices; only the batches' contents
  # matter for the equivalence this mode exists for).
  return tf.distribute.InputOptions(
      experimental_replication_mode=(
          tf.distribute.InputReplicationMode.PER_REPLICA),
      experimental_fetch_to_device=False)


def _no_eval_split(ds, ctx, nones: list, specs: list) -> tf.data.Dataset:
  """A stand-in for a pipeline's eval split of None (`ds`), which
  distribute() drops, its id added to `nones`; UserError where this
  process's pipelines disagree (`specs`: those made so far): a replica
  with eval batches would run the eval's collectives alone."""
  if ds is None and not specs:
    nones.append(ctx.input_pipeline_id)
    return tf.data.Dataset.range(0)
  none = nones[0] if nones else ctx.input_pipeline_id
  raise UserError(
      f"dataset_fn('eval', ...) returned None for input pipeline {none} "
      "but a tf.data.Dataset for another of this worker's; return None for "
      "every pipeline (no eval split) or a dataset for each (an empty "
      "shard: ds.take(0)).")


def _nones_filled(ds):
  """An eval split's batches with an empty dict in place of each None of
  theirs ((x, None), as Keras' fit takes them), which with_nones puts back
  before the model's step reads them: the eval's distributed dataset keeps
  TensorFlow's partial-batch handling, which makes an empty batch of each
  part and cannot make one of a None (TF 2.21: "'NoneTensorSpec' object
  has no attribute 'shape'"); an empty dict has no part to make."""
  if not isinstance(ds.element_spec, tuple) or not any(
      isinstance(s, tf.NoneTensorSpec) for s in ds.element_spec):
    return ds
  return ds.map(lambda *batch: tuple({} if p is None else p for p in batch))


def with_nones(batch):
  """A batch of an eval split as its dataset_fn made it (_nones_filled;
  an empty dict of its own, which no step of Keras' reads, comes as None
  too)."""
  if not isinstance(batch, tuple):
    return batch
  return tuple(None if isinstance(p, dict) and not p else p for p in batch)


def _check_some_eval_batches(sizes: list) -> None:
  """Refuses an eval split without batches in every pipeline, when this
  process made them all (one pipeline alone may have none: batches.py); a
  worker cannot see its peers' pipelines: the eval says it at run time."""
  if sizes and len(sizes) == sizes[0][0] and all(n == 0 for _, n in sizes):
    raise UserError(batches.no_eval_examples(
        f"dataset_fn('eval', ...) has no batches in any of its {len(sizes)}"
        " input pipelines"))


def reads_on_host(strategy) -> bool:
  """Whether the strategy's one replica runs on this host's CPU, where the
  input pipeline runs too (OneDeviceStrategy, or MirroredStrategy over one
  CPU device): its steps can read the dataset itself."""
  if not isinstance(strategy, (tf.distribute.OneDeviceStrategy,
                               tf.distribute.MirroredStrategy)):
    return False
  devices = strategy.extended.worker_devices
  return (len(devices) == 1 and
          tf.DeviceSpec.from_string(devices[0]).device_type == "CPU")


@contextlib.contextmanager
def _input_devices_kept(strategy):
  """Undoes what a PER_REPLICA distribution does to a MirroredStrategy.

  TF 2.21's MirroredStrategy keeps the per-replica input devices of such a
  call (`_input_workers_with_options` assigns `_input_workers_devices`), so
  every later dataset of that strategy object got one pipeline per replica
  too: a second run in one process read its data twice over. Restored here,
  in this one place; tests/data/test_data.py fails if TensorFlow moves it.
  """
  extended = strategy.extended
  saved = getattr(extended, "_input_workers_devices", None)
  try:
    yield
  finally:
    if saved is not None:
      extended._input_workers_devices = saved  # pylint: disable=protected-access


# The strategy's switches for TensorFlow's partial-batch handling, which
# each distributed dataset reads as it is made (TF 2.21's input_lib reads
# the first one a strategy has; 2.21's strategies set only the second).
_PARTIAL_BATCHES = ("enable_partial_batch_handling",
                    "experimental_enable_get_next_as_optional")


@contextlib.contextmanager
def _whole_batches(strategy, split: str):
  """Makes the train split's distributed dataset without TensorFlow's
  partial-batch handling (the eval split keeps it: its last batch is
  partial, and a pipeline may have none).

  With it (MultiWorkerMirroredStrategy's default for a pipeline not known
  to be infinite), every batch read all-reduces how many replicas got one
  and gives a replica whose pipeline ended an empty batch. Each worker
  decides from its own pipeline: one whose train stream was of unknown
  size (a filter) ran that all-reduce where a repeat()ed peer did not, and
  their first step's collectives mismatched ("Collective instance ...
  expected ... data_type 9 but got ... 1"); where every stream's size was
  unknown, a worker whose stream ended trained on empty batches to the
  end, silently. Train batches are whole (drop_remainder, batches.py):
  without it, a stream that ends raises OutOfRangeError on its own worker
  (the loop's run_dry_error).
  """
  extended = strategy.extended
  saved = {name: getattr(extended, name) for name in _PARTIAL_BATCHES
           if hasattr(extended, name)}
  if split == "train":
    for name in _PARTIAL_BATCHES:
      setattr(extended, name, False)
  try:
    yield
  finally:
    for name in _PARTIAL_BATCHES:
      if name in saved:
        setattr(extended, name, saved[name])
      elif hasattr(extended, name):
        delattr(extended, name)
