"""data.name="synthetic": one random batch per input pipeline, repeated.

The tf_cnn_benchmarks convention for measuring compute and synchronisation
alone: each pipeline builds ONE batch of random examples, once, and yields it
at every step (`Dataset.from_tensors(batch).repeat()`: held in memory, no
per-step work), so the step time is the model's compute and the gradient
all-reduce, not reading or decoding. The batch has the shape, dtype and
ranges of the config's real data (data.InputSpec), so the model built and
timed is the one the real data would train:
  * images: uniform in [0, 1), the range of every image source here but
    ImageNet's, whose normalised pixels span [-2.1, 2.6] (values do not change
    the arithmetic);
  * tokens: uniform in [0, vocab_size);
  * labels: uniform in [0, num_classes), one per token for language models.
The model learns nothing real from it: accuracy is meaningless (the run
says so: training/settings.py's SYNTHETIC_NOTE).
"""
import tensorflow as tf


class Source:
  """data.name=synthetic: batches of InputSpec `spec`, the config's declared
  data, and an eval split of `eval_size` examples of them."""
  cache = False

  def __init__(self, spec, eval_size: int):
    self.spec, self._eval_size = spec, eval_size

  def train_batches(self, batch_size: int, seed: int, input_context=None):
    """This pipeline's batch, built once and repeated forever.

    The stream is the same from any step, so a resumed run needs no skip.
    """
    return tf.data.Dataset.from_tensors(batch(
        self.spec, batch_size, seed, _pipeline(input_context))).repeat()

  def eval_examples(self, batch_size: int, seed: int, input_context=None):
    """Unbatched (features, label, id) of the eval split.

    Example i is row i mod batch_size of this pipeline's batch; ids are
    sharded by input pipeline like the built-in data's, for the exact eval.
    """
    ids = tf.data.Dataset.range(self._eval_size)
    if input_context and input_context.num_input_pipelines > 1:
      ids = ids.shard(input_context.num_input_pipelines,
                      input_context.input_pipeline_id)
    features, labels = batch(self.spec, batch_size, seed,
                             _pipeline(input_context))

    def example(i):
      row = i % batch_size
      return tf.gather(features, row), tf.gather(labels, row), i

    return ids.map(example)


def batch(spec, size: int, seed: int, pipeline: int = 0):
  """(features, labels): `size` random examples of InputSpec `spec`.

  A pure function of (seed, pipeline): every call makes the same batch.
  """
  feature_seed = tf.constant([seed, 2 * pipeline], tf.int64)
  label_seed = tf.constant([seed, 2 * pipeline + 1], tf.int64)
  shape = [size, *spec.shape]
  if spec.vocab_size:  # Token ids.
    features = tf.random.stateless_uniform(
        shape, feature_seed, minval=0, maxval=spec.vocab_size, dtype=tf.int32)
  else:
    features = tf.random.stateless_uniform(shape, feature_seed,
                                           dtype=spec.dtype)
  label_shape = [size, spec.shape[0]] if spec.per_token else [size]
  labels = tf.random.stateless_uniform(
      label_shape, label_seed, minval=0, maxval=spec.num_classes,
      dtype=tf.int32)
  return features, labels


def _pipeline(input_context) -> int:
  return input_context.input_pipeline_id if input_context else 0
