"""The built-in data: data.name -> a source, opened and checked once, and
the per-replica input pipeline over it.

A source (generated.Source, tfds_sources.Source) states its InputSpec and
returns unbatched examples of one split, already sharded by input pipeline;
`dataset_fn` batches them per replica, as a user's `dataset_fn` would, and
the loop distributes them the same way as a user's. data.name=synthetic is
the exception: one constant random batch per pipeline, shaped like the
config's real data (constant_batch.Source, specs.declared).
"""
import dataclasses

import tensorflow as tf

from dist_keras import catalog, terminal
from dist_keras.data import constant_batch, generated, specs, tfds_sources
from dist_keras.data.specs import InputSpec  # Also the package's: data.InputSpec.

SYNTHETIC = catalog.SYNTHETIC  # Constant batches (constant_batch).


def source(data_cfg, inputs: str = ""):
  """The built-in data `data_cfg.name` names, its settings checked.

  `inputs` (specs.INPUT_KINDS: what the model reads) is needed only by
  data.name=synthetic, whose spec is the one the config declares for its
  real data (specs.declared).
  """
  if data_cfg.name == SYNTHETIC:
    return constant_batch.Source(specs.declared(data_cfg, inputs),
                                 data_cfg.eval_size)
  if tfds_sources.is_tfds(data_cfg.name):
    opened = tfds_sources.Source(data_cfg)
    _warn_if_declared_differs(data_cfg, opened.spec)
    return opened
  return generated.Source(data_cfg)


_warned = set()


def _warn_if_declared_differs(data_cfg, spec: InputSpec) -> None:
  """One stderr line (once) if data.name=synthetic would build another model
  than `spec`, the real data's: the config declares other shape keys."""
  fixes = " ".join(f"data.{key}={value}" for key, value in
                   specs.declared_keys(spec).items()
                   if getattr(data_cfg, key) != value)
  if fixes and fixes not in _warned:
    _warned.add(fixes)
    terminal.say(
        f"dist_keras: warning: data.name={data_cfg.name!r} gives inputs "
        f"{spec.shape} with {spec.num_classes} classes; the config declares "
        f"other values, so data.name={SYNTHETIC} would build another model: "
        f"set {fixes} in the config.", err=True)


@dataclasses.dataclass(frozen=True)
class Batching:
  """How a built-in source's examples become per-replica batches."""
  global_batch_size: int
  seed: int
  shuffle_buffer: int
  threads: int = 0  # The pipeline's own thread pool; 0: TensorFlow's.
  prefetch: bool = True

  @classmethod
  def from_config(cls, config) -> "Batching":
    d = config.data
    return cls(config.train.global_batch_size, config.runtime.seed,
               d.shuffle_buffer, d.threads, d.prefetch)


def dataset_fn(src, batching: Batching, with_ids: bool = False):
  """The built-in `dataset_fn(split, input_context)` over source `src`.

  Like a user's, it returns that pipeline's per-replica batches of
  (features, label). Train: shuffled with the seed, repeated, batches of
  exactly global / replicas examples (static shapes). Every example is a
  pure function of the seed, so the stream is the same on every run and the
  loop can resume it by skipping the steps already trained. Eval: one pass
  in order, sharded by input pipeline, the last batch partial: with any
  number of replicas and workers each example is evaluated exactly once
  (TensorFlow hands replicas that run out of data empty batches).
  data.name=synthetic: one constant batch, repeated, and an eval split of
  data.eval_size examples of it. `with_ids` (tests) adds each eval
  example's index in the split as a third element.
  """
  seed, constant = batching.seed, isinstance(src, constant_batch.Source)

  def make(split: str, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(batching.global_batch_size)
    if split == "train" and constant:
      ds = src.train_batches(batch, seed, ctx)
    elif split == "train":
      ds = src.examples(split, seed, ctx)
      ds = ds.cache() if src.cache else ds
      ds = ds.shuffle(batching.shuffle_buffer, seed=seed,
                      reshuffle_each_iteration=True).repeat()
      ds = ds.batch(batch, drop_remainder=True)
    else:
      ds = (src.eval_examples(batch, seed, ctx) if constant else
            src.examples(split, seed, ctx, with_ids=True))
      if not with_ids:
        ds = ds.map(lambda x, y, i: (x, y))
      ds = ds.batch(batch)
    return _with_options(ds, batching)

  return make


def _with_options(ds, batching: Batching):
  """The pipeline's tf.data options: prefetching and its thread pool.

  Determinism is not an option: exact resume and the eval's exactly-once
  count rely on every pipeline producing the same stream every time.
  """
  if batching.threads:
    options = tf.data.Options()
    # The pipeline's own threads: it no longer competes with the step's ops
    # for TensorFlow's inter-op pool.
    options.threading.private_threadpool_size = batching.threads
    ds = ds.with_options(options)
  return ds.prefetch(tf.data.AUTOTUNE) if batching.prefetch else ds
