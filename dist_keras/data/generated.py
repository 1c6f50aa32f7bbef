"""Built-in datasets generated on the fly: no download, deterministic.

Every example is a pure function of (seed, split, index) through stateless
random ops, so a split is the same whatever the sharding, and the train and
eval splits draw from disjoint index ranges (disjoint random streams).
"""
import functools

import tensorflow as tf

from dist_keras import catalog
from dist_keras.data.specs import InputSpec
from dist_keras.errors import UserError

# Eval indices start here, far past any train index: disjoint seeds.
_EVAL_INDEX_OFFSET = 1 << 40
SHAPE_NAMES = ("square", "circle", "triangle", "cross")


def indices(data_cfg, split: str, input_context=None) -> tf.data.Dataset:
  """Example indices of `split`, sharded by input pipeline at the source."""
  size = data_cfg.train_size if split == "train" else data_cfg.eval_size
  offset = 0 if split == "train" else _EVAL_INDEX_OFFSET
  ds = tf.data.Dataset.range(offset, offset + size)
  if input_context and input_context.num_input_pipelines > 1:
    ds = ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)
  return ds


def _seed(seed, index):
  return tf.stack([tf.cast(seed, tf.int64), index])


def longmem_example(index, *, seed, seq_len, vocab_size, num_classes):
  """A sequence whose label is its FIRST token mod `num_classes`.

  The remaining seq_len - 1 tokens are uniform noise from the same vocabulary:
  to classify the sequence a model must carry the first token across all of
  them, the way a batsman carries the first delivery of an innings.
  """
  tokens = tf.random.stateless_uniform(
      [seq_len], seed=_seed(seed, index), minval=0, maxval=vocab_size,
      dtype=tf.int32)
  return tokens, tokens[0] % num_classes


def shapes_example(index, *, seed, image_size, num_classes, noise):
  """A noisy image of one of `num_classes` shapes at a random place and size."""
  s = _seed(seed, index)
  u = tf.random.stateless_uniform([5], seed=s)
  label = tf.cast(u[0] * num_classes, tf.int32)
  radius = 4.0 + u[1] * (image_size / 4 - 4.0)
  cy = radius + u[2] * (image_size - 2 * radius - 1)
  cx = radius + u[3] * (image_size - 2 * radius - 1)
  intensity = 0.6 + 0.4 * u[4]
  y, x = tf.meshgrid(tf.range(image_size, dtype=tf.float32),
                     tf.range(image_size, dtype=tf.float32), indexing="ij")
  dy, dx = tf.abs(y - cy), tf.abs(x - cx)
  arm = radius / 3
  masks = tf.stack([
      (dy <= radius) & (dx <= radius),  # square
      dx * dx + dy * dy <= radius * radius,  # circle
      (dy <= radius) & (dx <= (y - cy + radius) / 2),  # triangle, apex up
      ((dx <= arm) & (dy <= radius)) | ((dy <= arm) & (dx <= radius)),  # cross
  ])[:num_classes]
  shape = tf.cast(tf.gather(masks, label), tf.float32) * intensity
  pixels = tf.random.stateless_normal([image_size, image_size],
                                      seed=s + [0, 1 << 41])
  image = tf.clip_by_value(shape + noise * pixels, 0.0, 1.0)
  return image[..., None], label


def longmem(data_cfg, split, seed, input_context=None,
            with_ids=False) -> tf.data.Dataset:
  """Unbatched (tokens[seq_len] int32, label int32[, id]) of `split`."""
  return _generate(data_cfg, split, input_context, with_ids, functools.partial(
      longmem_example, seed=seed, seq_len=data_cfg.seq_len,
      vocab_size=data_cfg.vocab_size, num_classes=data_cfg.num_classes))


def shapes(data_cfg, split, seed, input_context=None,
           with_ids=False) -> tf.data.Dataset:
  """Unbatched (image[S, S, 1] float32 in [0, 1], label int32[, id])."""
  return _generate(data_cfg, split, input_context, with_ids, functools.partial(
      shapes_example, seed=seed, image_size=data_cfg.image_size,
      num_classes=data_cfg.num_classes, noise=data_cfg.noise))


class Source:
  """data.name=longmem or shapes, its settings checked: examples made on
  the fly, small enough to cache after the first epoch."""
  cache = True

  def __init__(self, data_cfg):
    if data_cfg.name not in catalog.GENERATED:
      raise ValueError(f"data.name={data_cfg.name!r} is not generated here.")
    check(data_cfg, data_cfg.name)
    self._cfg = data_cfg
    if data_cfg.name == "longmem":
      self.spec = InputSpec((data_cfg.seq_len,), "int32",
                            data_cfg.num_classes, data_cfg.vocab_size)
    else:
      size = data_cfg.image_size
      self.spec = InputSpec((size, size, 1), "float32", data_cfg.num_classes)

  def examples(self, split, seed, input_context=None, with_ids=False):
    """Unbatched (features, label[, id]) of `split`, this pipeline's shard."""
    make = longmem if self._cfg.name == "longmem" else shapes
    return make(self._cfg, split, seed, input_context, with_ids)


def _generate(data_cfg, split, input_context, with_ids, make_example):
  """Maps this pipeline's shard of `split`'s indices to their examples.

  With `with_ids`, each example also carries its index in the split.
  """
  offset = 0 if split == "train" else _EVAL_INDEX_OFFSET

  def example(index):
    features, label = make_example(index)
    return (features, label, index - offset) if with_ids else (features,
                                                               label)

  return indices(data_cfg, split, input_context).map(
      example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def check(data_cfg, name):
  """Raises UserError for settings the generators cannot honour."""
  if name == "shapes" and not 1 <= data_cfg.num_classes <= len(SHAPE_NAMES):
    raise UserError(f"data.num_classes={data_cfg.num_classes} for shapes "
                     f"must be 1..{len(SHAPE_NAMES)} ({', '.join(SHAPE_NAMES)}).")
  if name == "shapes" and data_cfg.image_size < 16:
    raise UserError(f"data.image_size={data_cfg.image_size} must be >= 16.")
  if name == "shapes" and data_cfg.channels != 1:
    raise UserError(f"data.channels={data_cfg.channels} for shapes must be 1 "
                    "(grey images).")
  if name == "longmem" and data_cfg.vocab_size < data_cfg.num_classes:
    raise UserError(f"data.vocab_size={data_cfg.vocab_size} must be >= "
                     f"data.num_classes={data_cfg.num_classes}.")
