"""What the TFDS sources (tfds_sources.py) do to each example: text to
hashed word ids, images scaled (or ImageNet's Inception-style crops), text
to byte windows for a character language model. Pure functions of their
inputs (and, for ImageNet's train crops, of a per-example seed).
"""
import tensorflow as tf

# imagenet2012: mean and std of the RGB channels over the train set, in [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Eval resizes the shorter side to image_size / this, then crops the centre
# (224 -> 256 -> 224: the standard ImageNet eval).
_IMAGENET_CROP_FRACTION = 0.875


def for_kind(k, data_cfg, features, train):
  """`(example dict[, random int]) -> (features, label)` for tfds_sources'
  kind `k` (text, imagenet, images) of dataset `data_cfg.name`."""
  if k == "text":
    return lambda ex: (hash_tokens(ex["text"], data_cfg.seq_len,
                                   data_cfg.vocab_size), _label(ex))
  if k == "imagenet":
    if train:
      return lambda ex, r: (imagenet_train(ex["image"], data_cfg.image_size,
                                           tf.stack([r, 0])), _label(ex))
    return lambda ex: (imagenet_eval(ex["image"], data_cfg.image_size),
                       _label(ex))
  size = data_cfg.image_size or features["image"].shape[0]
  return lambda ex: (scale_image(ex["image"], size), _label(ex))


def _label(ex):
  return tf.cast(ex["label"], tf.int32)


def hash_tokens(text, seq_len: int, vocab_size: int):
  """A string -> int32[seq_len] ids of its last seq_len lower-cased words.

  Words are runs of letters and digits; id = 1 + hash(word) mod
  (vocab_size - 1); 0 pads at the front.
  """
  text = tf.strings.lower(text, encoding="utf-8")
  text = tf.strings.regex_replace(text, r"<br\s*/?>", " ")  # IMDB's HTML.
  words = tf.strings.split(tf.strings.regex_replace(text, r"[^\pL\pN]+", " "))
  ids = tf.strings.to_hash_bucket_fast(words, vocab_size - 1) + 1
  ids = tf.cast(ids[-seq_len:], tf.int32)
  ids = tf.pad(ids, [[seq_len - tf.size(ids), 0]])
  return tf.ensure_shape(ids, [seq_len])


def scale_image(image, size: int):
  """uint8 [H, W, C] -> float32 [size, size, C] in [0, 1]."""
  image = tf.image.convert_image_dtype(image, tf.float32)
  if image.shape[0] != size or image.shape[1] != size:
    image = resize_and_crop(image, size, size)
  return image


def resize_and_crop(image, shorter_side, size: int):
  """Resizes the shorter side to `shorter_side`, then crops the centre."""
  hw = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = tf.cast(shorter_side, tf.float32) / tf.reduce_min(hw)
  new_hw = tf.maximum(tf.cast(tf.math.ceil(hw * scale), tf.int32), size)
  image = tf.image.resize(image, new_hw, antialias=True)
  top, left = (new_hw[0] - size) // 2, (new_hw[1] - size) // 2
  image = tf.image.crop_to_bounding_box(image, top, left, size, size)
  return tf.ensure_shape(image, [size, size, image.shape[-1]])


def imagenet_train(jpeg, size: int, seed):
  """A random crop of 8-100% of the area, aspect 3/4-4/3, flipped at random.

  Inception-style: only the crop is decoded; `seed` (int64[2]) makes it a
  pure function of the example's random draw.
  """
  crop_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.image.extract_jpeg_shape(jpeg), tf.zeros([0, 0, 4], tf.float32),
      seed=crop_seed, min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
      max_attempts=10, use_image_if_no_bounding_boxes=True)
  window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
  image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
  image = tf.image.resize(image, [size, size], antialias=True) / 255.0
  image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return _normalise(image)


def imagenet_eval(jpeg, size: int):
  """Shorter side to size / 0.875, central size x size crop, normalised."""
  image = tf.io.decode_jpeg(jpeg, channels=3)
  image = tf.image.convert_image_dtype(image, tf.float32)
  shorter = int(round(size / _IMAGENET_CROP_FRACTION))
  return _normalise(resize_and_crop(image, shorter, size))


def _normalise(image):
  return tf.ensure_shape((image - IMAGENET_MEAN) / IMAGENET_STD,
                         [image.shape[0], image.shape[1], 3])


def byte_windows(text, seq_len: int):
  """A string -> (inputs, targets) int32 [num_windows, seq_len] of its bytes.

  Window k holds bytes k*seq_len .. k*seq_len + seq_len: consecutive windows
  share one byte, so every byte after the first is a target exactly once.
  """
  data = tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32)
  num = (tf.size(data) - 1) // seq_len
  inputs = tf.reshape(data[:num * seq_len], [num, seq_len])
  targets = tf.reshape(data[1:num * seq_len + 1], [num, seq_len])
  return inputs, targets
