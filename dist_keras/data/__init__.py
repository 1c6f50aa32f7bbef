"""Dataset registry and the per-replica input pipeline.

Builders return unbatched examples of one split, already sharded by input
pipeline; `dataset_fn` batches them per replica, as a user's `dataset_fn`
would, and the loop distributes them the same way as a user's.
data.name=synthetic is the exception: one constant random batch per pipeline,
shaped like the config's real data (constant_batch, declared_spec).
"""
import dataclasses
import sys
from typing import Callable

import tensorflow as tf

from dist_keras.data import constant_batch
from dist_keras.data import generated
from dist_keras.data import tfds_sources
from dist_keras import validate
from dist_keras.errors import UserError


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """What a model needs to know about its inputs."""
  shape: tuple
  dtype: str
  num_classes: int
  vocab_size: int = 0  # Token inputs only.
  # Labels are one class per input token ([batch, seq_len]), e.g. a language
  # model: the loss and accuracy are per token and perplexity is exp(loss).
  per_token: bool = False


def _builder(name: str) -> Callable:
  """The builder of data.name: a generated dataset (validate.GENERATED), or
  TFDS's reader for any tfds:NAME."""
  if tfds_sources.is_tfds(name):
    return tfds_sources.build
  return getattr(generated, name)


SYNTHETIC = validate.SYNTHETIC  # Constant batches (constant_batch).
# What a model reads (models.inputs): data.name=synthetic builds batches of it.
INPUT_KINDS = ("images", "tokens", "per_token")


def input_spec(data_cfg, inputs: str = "") -> InputSpec:
  """The InputSpec of the dataset `data_cfg.name`.

  `inputs` (one of INPUT_KINDS: what the model reads) is needed only by
  data.name=synthetic, whose spec is the one the config declares for its
  real data (declared_spec); TFDS reads its spec from the data.
  """
  _check(data_cfg)
  if data_cfg.name == SYNTHETIC:
    return declared_spec(data_cfg, inputs)
  if tfds_sources.is_tfds(data_cfg.name):
    spec = InputSpec(**tfds_sources.spec(data_cfg))
    _warn_if_declared_differs(data_cfg, spec)
    return spec
  if data_cfg.name == "longmem":
    return InputSpec((data_cfg.seq_len,), "int32", data_cfg.num_classes,
                     data_cfg.vocab_size)
  size = data_cfg.image_size
  return InputSpec((size, size, 1), "float32", data_cfg.num_classes)


def _declared_keys(inputs: str, spec: InputSpec) -> dict:
  """{data config key: value} that describe `spec` for model `inputs`."""
  if inputs == "images":
    return {"image_size": spec.shape[0], "channels": spec.shape[2],
            "num_classes": spec.num_classes}
  return {"seq_len": spec.shape[0], "vocab_size": spec.vocab_size,
          "num_classes": spec.num_classes}


def declared_spec(data_cfg, inputs: str) -> InputSpec:
  """The InputSpec of the data `data_cfg` declares (data.image_size,
  channels, num_classes; data.seq_len, vocab_size, num_classes) for a model
  reading `inputs` (INPUT_KINDS); raises UserError for sizes below 1."""
  if inputs not in INPUT_KINDS:
    raise ValueError(f"data.name={data_cfg.name} needs the model's inputs, "
                     f"one of {INPUT_KINDS} (models.inputs), not {inputs!r}.")
  keys = ("image_size", "channels") if inputs == "images" else (
      "seq_len", "vocab_size")
  for key in (*keys, "num_classes"):
    if getattr(data_cfg, key) < 1:
      raise UserError(f"data.{key}={getattr(data_cfg, key)} must be >= 1 for "
                      f"data.name={data_cfg.name}, which builds the inputs "
                      f"the config declares: set the real data's {key}.")
  if inputs == "images":
    size = data_cfg.image_size
    return InputSpec((size, size, data_cfg.channels), "float32",
                     data_cfg.num_classes)
  return InputSpec((data_cfg.seq_len,), "int32", data_cfg.num_classes,
                   data_cfg.vocab_size, per_token=inputs == "per_token")


_warned = set()


def _warn_if_declared_differs(data_cfg, spec: InputSpec) -> None:
  """One stderr line (once) if data.name=synthetic would build another model
  than `spec`, the real data's: the config declares other shape keys."""
  inputs = ("per_token" if spec.per_token else "tokens" if spec.vocab_size
            else "images")
  fixes = " ".join(f"data.{key}={value}" for key, value in
                   _declared_keys(inputs, spec).items()
                   if getattr(data_cfg, key) != value)
  if fixes and fixes not in _warned:
    _warned.add(fixes)
    print(f"dist_keras: warning: data.name={data_cfg.name!r} gives inputs "
          f"{spec.shape} with {spec.num_classes} classes; the config declares "
          f"other values, so data.name={SYNTHETIC} would build another model: "
          f"set {fixes} in the config.", file=sys.stderr, flush=True)


def _check(data_cfg):
  """The built-in data's own settings (validate.py checks the generic)."""
  if data_cfg.name == SYNTHETIC:
    return None  # declared_spec checks the sizes it reads.
  if tfds_sources.is_tfds(data_cfg.name):
    return tfds_sources.check(data_cfg)
  validate.data_name(data_cfg.name)  # Checked before TensorFlow, too.
  generated.check(data_cfg, data_cfg.name)


def num_examples(data_cfg, split: str) -> int:
  """Examples in `split` of `data_cfg.name` (all pipelines together)."""
  if tfds_sources.is_tfds(data_cfg.name):
    return tfds_sources.num_examples(data_cfg, split)
  return generated.num_examples(data_cfg, split)


def dataset_fn(config, spec=None, with_ids: bool = False):
  """The built-in `dataset_fn(split, input_context)` of `config.data.name`.

  Like a user's, it returns that pipeline's per-replica batches of
  (features, label). Train: shuffled with runtime.seed, repeated, batches
  of exactly global / replicas examples (static shapes). Every example is a
  pure function of the seed, so the stream is the same on every run and the
  loop can resume it by skipping the steps already trained. Eval: one pass
  in order, sharded by input pipeline, the last batch partial: with any
  number of replicas and workers each example is evaluated exactly once
  (TensorFlow hands replicas that run out of data empty batches).
  data.name=synthetic needs the model's InputSpec `spec` (input_spec): its
  train stream is one constant batch (constant_batch) and its eval split
  data.eval_size examples of it. `with_ids` (tests) adds each eval
  example's index in the split as a third element.
  """
  data_cfg, seed = config.data, config.runtime.seed
  global_batch_size = config.train.global_batch_size
  synthetic_batches = data_cfg.name == SYNTHETIC
  if synthetic_batches and spec is None:
    raise ValueError("data.name=synthetic: pass the model's InputSpec "
                     "(spec=input_spec(data_cfg, models.inputs(model_cfg))).")
  build = None if synthetic_batches else _builder(data_cfg.name)
  eval_size = num_examples(data_cfg, "eval")

  def make(split: str, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch_size)
    if split == "train" and synthetic_batches:
      ds = constant_batch.train(spec, batch, seed, ctx)
    elif split == "train":
      ds = build(data_cfg, split, seed, ctx)
      if data_cfg.name in _CACHED:
        ds = ds.cache()
      ds = ds.shuffle(data_cfg.shuffle_buffer, seed=seed,
                      reshuffle_each_iteration=True).repeat()
      ds = ds.batch(batch, drop_remainder=True)
    else:
      ds = (constant_batch.eval_examples(spec, eval_size, batch, seed, ctx)
            if synthetic_batches else
            build(data_cfg, split, seed, ctx, with_ids=True))
      if not with_ids:
        ds = ds.map(lambda x, y, i: (x, y))
      ds = ds.batch(batch)
    return _with_options(ds, data_cfg)

  return make


def _with_options(ds, data_cfg):
  """The pipeline's tf.data options: prefetching and its thread pool.

  Determinism is not an option: exact resume and the eval's exactly-once
  count rely on every pipeline producing the same stream every time.
  """
  if data_cfg.threads:
    options = tf.data.Options()
    # The pipeline's own threads: it no longer competes with the step's ops
    # for TensorFlow's inter-op pool.
    options.threading.private_threadpool_size = data_cfg.threads
    ds = ds.with_options(options)
  return ds.prefetch(tf.data.AUTOTUNE) if data_cfg.prefetch else ds


# Generated on the fly and small: cached after the first epoch. TFDS sources
# cache their records themselves where they are small (try_autocache).
_CACHED = ("longmem", "shapes")
