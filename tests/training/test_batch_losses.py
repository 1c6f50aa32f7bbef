"""A compiled loss that returns one number per batch (a function ending in
tf.reduce_mean, a keras.losses.Loss whose call returns a scalar) trains at
2 replicas what it trains on one device (training/batch_losses.py). Keras
passes such a value on undivided under tf.distribute, so 2 replicas summed
2 batch means: weights 0.04 apart after 12 SGD steps and an eval_loss
twice the model's, silently, as under fit with MirroredStrategy."""
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras.errors import UserError
from dist_keras.training import batch_losses

CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": 12, "train.log_every": 12, "eval.every": 0,
          "log.calibration_steps": 0, "log.tensorboard": False,
          "log.progress": True}


def scalar_mse(y_true, y_pred):
  return tf.reduce_mean(tf.square(y_true - y_pred))


class ScalarMSE(keras.losses.Loss):
  def call(self, y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred))


def batch_logsumexp(y_true, y_pred):
  """One number per batch that is neither its mean nor its sum."""
  return tf.reduce_logsumexp(tf.square(y_true - y_pred))


def _model(make_loss):
  inputs = keras.Input((parity_task.FEATURES,))
  hidden = keras.layers.Dense(16, activation="tanh")(inputs)
  model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss=make_loss())
  return model


def _fit(make_loss, strategy, workdir):
  return dist_keras.fit(functools.partial(_model, make_loss),
                        parity_task.dataset_fn, workdir=str(workdir),
                        config=CONFIG, strategy=strategy)


def _mse_on_eval_split(model) -> float:
  x, y = parity_task._examples("eval")  # pylint: disable=protected-access
  return float(np.mean((model(x).numpy() - y) ** 2))


@pytest.mark.parametrize("make_loss", [lambda: scalar_mse, ScalarMSE],
                         ids=["function", "loss_class"])
def test_a_loss_of_one_mean_per_batch_trains_what_one_device_trains(
    tmp_path, mirrored, capsys, make_loss):
  one = _fit(make_loss, "one_device", tmp_path / "one")
  two = _fit(make_loss, mirrored, tmp_path / "two")
  out = capsys.readouterr().out
  for a, b in zip(one.model.weights, two.model.weights):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-5,
                               err_msg=a.path)
  for result in (one, two):  # The eval's loss is the model's MSE.
    assert result.summary["eval_loss"] == pytest.approx(
        _mse_on_eval_split(result.model), rel=1e-4)
  name = "scalar_mse" if make_loss is not ScalarMSE else "ScalarMSE"
  assert out.count(f"the compiled loss {name} returns one number per batch,"
                   " its mean, which Keras does not divide by the replicas"
                   ) == 1, out  # At 2 replicas only.
  assert "dist_keras divides it by the 2 replicas" in out


def test_a_loss_of_one_number_per_batch_neither_mean_nor_sum_is_refused(
    tmp_path, mirrored):
  with pytest.raises(UserError, match=(
      r"^the compiled loss batch_logsumexp returns one number per batch, "
      r"which Keras does not divide by the 2 replicas, and it is neither a "
      r"mean nor a sum .* return one value per example")):
    _fit(lambda: batch_logsumexp, mirrored, tmp_path / "w")
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("loss", ["mse", "sum"])
def test_losses_keras_divides_or_need_no_division_are_left_as_compiled(
    mirrored, loss):
  """A loss of a value per example (Keras reduces and divides it) and one
  of a sum per batch (the replicas' sums add up to the batch's) train as
  compiled, unsaid."""
  from dist_keras.contract import batches, model_calls, probe  # pylint: disable=g-import-not-at-top
  from dist_keras.training import batch_losses  # pylint: disable=g-import-not-at-top
  make = {"mse": lambda: "mse",
          "sum": lambda: lambda y, p: tf.reduce_sum(tf.square(y - p))}[loss]
  with mirrored.scope():
    model = _model(make)
  spec = (tf.TensorSpec([24, parity_task.FEATURES]), tf.TensorSpec([24, 1]))
  x, y = batches.zeros(spec)
  with mirrored.scope():
    model.compute_loss(x, y, model(x))  # Builds the compiled loss.
  before = [entry.loss for entry in model._compile_loss._flat_losses]  # pylint: disable=protected-access
  met = probe.Probe(spec, x, y, None, model_calls.zero_prediction(model, x))
  assert batch_losses.divide_means(model, mirrored, met) is None
  assert [entry.loss for entry in model._compile_loss._flat_losses] == before  # pylint: disable=protected-access


class _Calling(keras.losses.Loss):
  """A Loss whose call is `fn`, as Keras wraps a compiled function."""

  def __init__(self, fn):
    super().__init__()
    self.fn = fn

  def call(self, y_true, y_pred):
    return self.fn(y_true, y_pred)


def scalar_crossentropy(y_true, y_pred):
  """A hand-written batch mean that is 0 for labels of 0."""
  return -tf.reduce_mean(y_true * tf.math.log(y_pred))


def always_zero(y_true, y_pred):
  return 0.0 * tf.reduce_mean(y_pred)


@pytest.mark.parametrize("loss, kind", [
    (scalar_crossentropy, "mean"), (always_zero, "unknown"),
    (batch_logsumexp, None)])
def test_a_loss_zero_for_labels_of_0_is_still_told(loss, kind):
  """Labels of 0 score 0 under a cross-entropy: other labels are tried,
  and a loss 0 for all of them is said, not refused (nor divided)."""
  wrapped = _Calling(loss)
  y = tf.zeros((4, 1))
  assert batch_losses._kind(wrapped, y, y) == kind  # pylint: disable=protected-access
