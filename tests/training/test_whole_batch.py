"""A compiled loss that scores the batch as a whole (keras.losses.Dice with
its default axis=None: one ratio over every example; a contrastive loss
over the batch's pairs) is refused at 2 replicas (training/whole_batch.py):
each replica scores its own half, and no division of that makes one
device's loss. Before, Dice was taken for a mean and divided (weights
2.8e-3 off Keras' fit on one device after 12 SGD steps, the run saying it
trained what one device trains), and the contrastive loss was said to be
"0 on every batch tried" (weights 0.54 off). Every other loss of
keras.losses, a value per example, is left as compiled; one device is
unchanged."""
import functools
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras.errors import UserError
from dist_keras.training import batch_losses, whole_batch

CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": 6, "train.log_every": 6, "eval.every": 0,
          "log.calibration_steps": 0, "log.tensorboard": False}


def contrastive(y_true, y_pred):
  """A supervised contrastive loss over the batch's pairs of examples
  (those of one label drawn together): one number per batch."""
  z = tf.math.l2_normalize(y_pred, axis=-1)
  logits = tf.matmul(z, z, transpose_b=True) / 0.5
  y = tf.reshape(y_true, [-1, 1])
  same = tf.cast(tf.equal(y, tf.transpose(y)), logits.dtype)
  targets = same / tf.reduce_sum(same, axis=-1, keepdims=True)
  return tf.reduce_mean(
      tf.nn.softmax_cross_entropy_with_logits(targets, logits))


def _model(make_loss, units: int = 1):
  keras.utils.set_random_seed(0)
  inputs = keras.Input((parity_task.FEATURES,))
  hidden = keras.layers.Dense(16, activation="tanh")(inputs)
  outputs = keras.layers.Dense(units, activation="sigmoid")(hidden)
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.SGD(0.5), loss=make_loss())
  return model


def _binary(split, input_context):
  """parity_task's batches, their labels 0 or 1."""
  return parity_task.dataset_fn(split, input_context).map(
      lambda x, y: (x, tf.cast(y > 0, tf.float32)))


def _fit(model_fn, strategy, workdir):
  return dist_keras.fit(model_fn, _binary, workdir=str(workdir),
                        config=CONFIG, strategy=strategy)


@pytest.mark.parametrize("make_loss, units, message", [
    (keras.losses.Dice, 1,
     r"^the compiled loss dice scores the batch as a whole, not as the mean "
     r"of its examples' values \(two halves of a batch score .* together, "
     r".*\), so 2 replicas, each scoring its own part of the batch, cannot "
     r"train what one device trains; compile keras.losses.Dice\(axis=\(1,\)"
     r"\) to score each example .*, or train on one replica \(runtime."
     r"strategy=one_device\); see what is refused: own_models.md, linked "
     r"from the README's \"Python API: your own model and data\".$"),
    (lambda: contrastive, 4,
     r"^the compiled loss contrastive scores the batch as a whole, .*; "
     r"return one value per example \(each from that example's labels and "
     r"prediction alone\) and let Keras reduce the batch, or train on one "
     r"replica")], ids=["dice", "contrastive"])
def test_a_loss_of_the_whole_batch_is_refused_at_2_replicas(
    tmp_path, mirrored, make_loss, units, message):
  with pytest.raises(UserError, match=message) as raised:
    _fit(functools.partial(_model, make_loss, units), mirrored,
         tmp_path / "w")
  assert "\n" not in str(raised.value)
  assert raised.value.exit_code == 2
  assert not (tmp_path / "w").exists()


def test_dice_on_one_device_trains_what_keras_fit_trains(tmp_path):
  """One device: nothing said or refused; = Keras' fit on the same
  batches."""
  ours = _fit(functools.partial(_model, keras.losses.Dice), "one_device",
              tmp_path / "one")
  model = _model(keras.losses.Dice)
  model.fit(_binary("train", tf.distribute.InputContext()),
            steps_per_epoch=CONFIG["train.steps"], shuffle=False,
            verbose=0)
  for a, b in zip(model.weights, ours.model.weights):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6,
                               err_msg=a.path)


# Every keras.losses class, with the (labels, prediction) shapes of a batch
# of one it applies to, and whether it scores the batch as a whole there.
_REGRESSION = [((1, 1), (1, 1)), ((1, 4), (1, 4)), ((1, 8, 8, 1),) * 2]
_CLASSES = [((1, 4), (1, 4)), ((1, 8, 8, 3),) * 2]
_SPARSE = [((1,), (1, 4)), ((1, 1), (1, 4)), ((1, 5), (1, 5, 4))]
_LOSSES = {
    **{name: (_REGRESSION, False) for name in (
        "MeanSquaredError", "MeanAbsoluteError",
        "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError",
        "Huber", "LogCosh", "Poisson", "KLDivergence", "CosineSimilarity",
        "Hinge", "SquaredHinge", "CategoricalHinge", "BinaryCrossentropy",
        "BinaryFocalCrossentropy")},
    **{name: (_CLASSES, False) for name in (
        "CategoricalCrossentropy", "CategoricalFocalCrossentropy")},
    "SparseCategoricalCrossentropy": (_SPARSE, False),
    # Labels [batch, 1] broadcast against [batch, classes] in Keras' own
    # function: a value per pair of examples (on one device too).
    "CategoricalGeneralizedCrossEntropy": (_SPARSE[:1], False),
    "CTC": ([((1, 5), (1, 6, 4))], False),
    "Dice": (_REGRESSION, True), "Tversky": (_REGRESSION, True),
    "Circle": ([((1,), (1, 4))], True),  # Its pairs of examples.
}


def _cases():
  for name, (shapes, whole) in sorted(_LOSSES.items()):
    for y_shape, p_shape in shapes:
      yield pytest.param(name, y_shape, p_shape, whole,
                         id=f"{name}-{'x'.join(map(str, p_shape))}")


def test_every_keras_loss_is_in_the_table():
  """A loss a Keras release adds is checked too, once listed above."""
  classes = {name for name, value in vars(keras.losses).items()
             if inspect.isclass(value) and issubclass(value, keras.losses.Loss)
             and value is not keras.losses.Loss}
  assert classes == set(_LOSSES)


def _refused(loss, y_shape, p_shape) -> bool:
  """Whether the compiled loss `loss` is refused at 2 replicas for a zero
  batch of one example of these shapes (batch_losses' kind, then
  whole_batch's check, as divide_means calls them)."""
  y, p = tf.zeros(y_shape), tf.zeros(p_shape)
  kind = batch_losses._kind(loss, y, p)  # pylint: disable=protected-access
  try:
    whole_batch.check(loss, loss.name, kind, (y, p), replicas=2)
  except UserError:
    return True
  return False


@pytest.mark.parametrize("name, y_shape, p_shape, whole", list(_cases()))
def test_only_the_losses_of_the_whole_batch_are_refused(
    name, y_shape, p_shape, whole):
  loss = getattr(keras.losses, name)()
  assert _refused(loss, y_shape, p_shape) == whole
  if whole and name != "Circle":  # Scored per example: kept as compiled.
    per_example = getattr(keras.losses, name)(
        axis=tuple(range(1, len(p_shape))))
    assert not _refused(per_example, y_shape, p_shape)


@pytest.mark.parametrize("loss, refused", [
    (keras.losses.MeanSquaredError(reduction="sum"), False),
    (keras.losses.CategoricalGeneralizedCrossEntropy(), True),
    (keras.losses.Dice(reduction="sum"), True)],
                         ids=["mse_sum", "cgce_labels_b1", "dice_sum"])
def test_a_sum_is_kept_and_a_value_per_pair_refused(loss, refused):
  """A sum of values per example adds up over the replicas: kept. Labels
  [batch, 1] with Keras' generalized cross-entropy give a value per pair
  of examples: refused, with the shapes said."""
  assert _refused(loss, (1, 1), (1, 4)) == refused
  if refused and "generalized" in loss.name:
    with pytest.raises(UserError, match=r"a row for every pair of examples "
                       r"\(\(4, 4\) for 4 examples; labels of shape \[batch"
                       r", 1\] broadcast against predictions of shape "
                       r"\[batch, 4\]\?\)"):
      whole_batch.check(loss, loss.name, "example",
                        (tf.zeros((1, 1)), tf.zeros((1, 4))), replicas=2)
