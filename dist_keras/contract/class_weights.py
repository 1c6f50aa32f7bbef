"""train.class_weight: Keras' fit(class_weight=...) as a config key, a
weight per class index (Keras' {class: weight} dict, the classes it leaves
out weighing 1). As fit does, each train batch's labels become its sample
weights (keras/src/trainers/data_adapters/tf_dataset_adapter.py's
make_class_weight_map_fn, the same ops, so one device = fit bitwise); the
eval split is not weighed, as fit's validation_data is not. A label past
the last class given weighs 1, as a class the dict leaves out. Nothing here
imports TensorFlow at import time: fit's door reads it before TF starts."""
import numbers

from dist_keras.errors import UserError

KEY = "train.class_weight"


def as_weights(class_weight) -> tuple:
  """Keras' fit(class_weight={class: weight}) as train.class_weight's
  tuple: class i's weight at index i, 1.0 for a class the dict leaves out
  (as fit fills them). UserError for what fit could not take."""
  if not isinstance(class_weight, dict) or not class_weight or not all(
      isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 0
      for k in class_weight):
    raise UserError(
        f"class_weight={class_weight!r} is not a dict of class index (an int"
        " >= 0) to weight, as Keras' fit takes it; pass e.g. "
        "class_weight={0: 1.0, 1: 50.0}.")
  weights = tuple(class_weight.get(c, 1.0)
                  for c in range(max(class_weight) + 1))
  check(weights)
  return weights


def check(weights) -> None:
  """UserError unless `weights` (train.class_weight) are numbers >= 0."""
  bad = [w for w in weights if isinstance(w, bool) or not isinstance(
      w, numbers.Real) or not 0 <= w < float("inf")]
  if bad:
    raise UserError(
        f"{KEY}={tuple(weights)!r} holds {bad[0]!r}, not a weight; give one "
        "finite number >= 0 per class index, e.g. (1.0, 50.0): class 0 "
        "weighs 1, class 1 weighs 50.")


def weighed(ds, weights: tuple):
  """`ds` (the train split's (x, y) batches) with class `weights` as its
  sample weights, as Keras' fit maps its dataset; UserError for batches
  fit would refuse (sample weights already, several outputs' labels)."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(ds.element_spec)
  said = f"{KEY}={weights!r}, but dataset_fn('train', ...)"
  if sample_weight is not None:
    raise UserError(f"{said} yields sample weights too, which Keras' fit "
                    "refuses as well; yield (x, y) batches, or fold the class"
                    " weights into your sample weights and drop the key.")
  if y is None or tf.nest.is_nested(y):
    raise UserError(f"{said} yields {'no' if y is None else 'several'} "
                    "labels; class weights take one label per example (Keras"
                    " weighs the classes of a model with a single output).")
  table = tf.convert_to_tensor(list(weights))

  def weigh(*batch):
    # A label past the tuple's end (or below 0) weighs 1, as a class the
    # dict leaves out: Keras 3.16's fit (keras#23073); 3.15's gather
    # failed on it (on a GPU, gathered 0: dropped the example).
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    classes = _classes(y)
    inside = (classes >= 0) & (classes < len(weights))
    return x, y, tf.where(inside, tf.gather(
        table, tf.clip_by_value(classes, 0, len(weights) - 1)), 1.0)

  del x
  return ds.map(weigh)


def _classes(y):
  """The class index of each example's label `y`: one-hot (its argmax),
  (N, 1) or (N,) indices (rounded: a float 0/1 label), as Keras reads them
  (its smart_cond: a static last size picks one branch, traced alone)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  one_hot = lambda: tf.argmax(y, axis=-1, output_type=tf.int32)
  indices = lambda: tf.cast(tf.round(tf.squeeze(y, axis=-1)), tf.int32)
  if y.shape.rank < 2:  # Rank 1: indices for sure.
    return tf.cast(tf.round(y), tf.int32)
  if y.shape[-1] is not None:
    return one_hot() if y.shape[-1] > 1 else indices()
  return tf.cond(tf.shape(y)[-1] > 1, one_hot, indices)
