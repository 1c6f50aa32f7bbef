"""A keras.losses.Loss the model calls in its own call and adds with
add_loss (keras.io's endpoint layer) trains and reports at 2 replicas what
it does on one device (training/call_losses.py). Keras divided it by the
replicas twice (the Loss's reduction, then compute_loss's division of the
model's own losses): 2 replicas trained on half the gradient (weights 0.19
apart after 12 SGD steps) and reported half the train loss and eval_loss,
silently, as fit under MirroredStrategy does. (tests/training/
test_fit_parity.py trains the model across workers too.)"""
import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.losses import loss as keras_loss

import dist_keras
import parity_task
from dist_keras.training import call_losses

CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": 12, "train.log_every": 6, "eval.every": 6,
          "log.calibration_steps": 0, "log.tensorboard": False}


def _fit(strategy, workdir):
  return dist_keras.fit(parity_task.endpoint, parity_task.endpoint_dataset_fn,
                        workdir=str(workdir), config=CONFIG,
                        strategy=strategy)


def test_a_loss_object_in_the_models_call_trains_what_one_device_trains(
    tmp_path, mirrored):
  one = _fit("one_device", tmp_path / "one")
  two = _fit(mirrored, tmp_path / "two")
  for a, b in zip(one.model.weights, two.model.weights):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-5,
                               err_msg=a.path)
  for name in ("loss", "val_loss"):
    np.testing.assert_allclose(two.history[name], one.history[name],
                               rtol=1e-5, err_msg=name)
  for name in ("train_loss", "eval_loss"):
    assert two.summary[name] == pytest.approx(one.summary[name], rel=1e-5)


def _reduced(strategy, in_call: bool, one_device: bool):
  """A mean-reduced Loss of a batch of 4 ones (1.0 on one device), on each
  of `strategy`'s replicas: in a layer's call or not, in as_one_device or
  not."""
  loss = keras.losses.MeanAbsoluteError()
  layer = keras.layers.Lambda(lambda t: loss(tf.zeros_like(t), t))

  def replica():
    with (call_losses.as_one_device() if one_device
          else contextlib.nullcontext()):
      ones = tf.ones((4, 1))
      return layer(ones) if in_call else loss(tf.zeros((4, 1)), ones)

  values = strategy.run(tf.function(replica, autograph=False))
  return [float(v) for v in strategy.experimental_local_results(values)]


@pytest.mark.parametrize("in_call, one_device, expected", [
    (True, True, 1.0), (False, True, 0.5), (True, False, 0.5)],
    ids=["in_the_call", "compiled_loss", "outside_the_steps"])
def test_only_a_loss_in_the_models_call_in_the_steps_is_left_undivided(
    mirrored, in_call, one_device, expected):
  put_back = call_losses.install()
  try:
    assert _reduced(mirrored, in_call, one_device) == [expected, expected]
  finally:
    put_back()
  assert not getattr(keras_loss.scale_loss_for_distribution,
                     "dist_keras_installed", False)


class OwnStep(keras.Model):
  """Its own train_step on compute_loss: the endpoint's Loss is divided
  in the call and again there (1/2 of the gradient at 2 replicas, weights
  0.17 apart after 12 SGD steps, as under fit): said at the start."""

  def train_step(self, data):
    (x,) = data
    with tf.GradientTape() as tape:
      loss = self.compute_loss(x=x, y_pred=self(x, training=True))
    self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                         self.trainable_variables)
    return {"loss": loss}


class TeacherStep(keras.Model):
  """Its own train_step on a mean taken by hand, beside a teacher's
  compute_loss (another model's losses): its own are divided once. Its
  name in the step's code was said as the model's compute_loss."""

  def train_step(self, data):
    (x,) = data
    with tf.GradientTape() as tape:
      loss = keras.ops.sum(self.losses) + 0.0 * keras.ops.mean(
          self(x, training=True))
    self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                         self.trainable_variables)
    return {"loss": loss, "teacher": self.teacher.compute_loss(x=x)}


class _OwnStep(OwnStep):
  """The same, named '__own_step': the trace of its call at a graph's
  outermost scope failed on that name, and the line was not said."""


def _own_step_endpoint(step_class=OwnStep):
  model = parity_task.endpoint()
  own = step_class(model.inputs, model.outputs)
  own.compile(optimizer=keras.optimizers.SGD(0.05))
  return own


@pytest.mark.parametrize("make, said", [
    (_own_step_endpoint, True), (parity_task.endpoint, False),
    (lambda: _own_step_endpoint(TeacherStep), False),
    (lambda: _own_step_endpoint(_OwnStep), True)],
    ids=["own_train_step", "keras_train_step", "another_models_compute",
         "own_train_step_named_with_a_leading_underscore"])
def test_an_own_step_dividing_a_loss_in_the_call_twice_is_said(
    mirrored, make, said):
  from dist_keras import installation  # pylint: disable=g-import-not-at-top
  from dist_keras.training import state_updates  # pylint: disable=g-import-not-at-top
  with mirrored.scope():
    model = make()
  spec = ((tf.TensorSpec([24, parity_task.FEATURES]),
           tf.TensorSpec([24, 1])),)
  put_back = call_losses.install()
  try:
    forward = state_updates.traced(
        model, installation.layers_in(model, include_self=False), mirrored,
        spec)
  finally:
    put_back()
  note = call_losses.own_step_note(model, 2, forward)
  assert (note is not None) == said, note
  if said:
    assert note.startswith(
        "the model's call reduces a keras.losses.Loss (for add_loss?), "
        "which Keras divides by the 2 replicas there and "
        f"{type(model).__name__}.train_step's compute_loss divides again, "
        "as under fit: if it is an add_loss "
        "term, the 2 replicas train on 1/2 of one device's gradient"), note


class OwnTestStep(keras.Model):
  """keras.io's own test_step on compute_loss, its loss tracker weighed by
  the batch's examples: fit at 2 replicas reported 1/4 of one device's
  eval loss (the endpoint's Loss divided in the call, then by
  compute_loss), where the start line says 1/2 (feed it loss * 2)."""

  def test_step(self, data):
    (x,) = data
    loss = self.compute_loss(x=x, y_pred=self(x, training=False))
    for metric in self.metrics:
      if metric.name == "loss":
        metric.update_state(loss, sample_weight=tf.shape(x[0])[0])
    return {m.name: m.result() for m in self.metrics}


def _own_test_step_endpoint():
  model = parity_task.endpoint()
  own = OwnTestStep(model.inputs, model.outputs)
  own.compile(optimizer=keras.optimizers.SGD(0.05))
  return own


def test_an_own_test_steps_compute_loss_divides_a_loss_in_the_call_once(
    tmp_path, mirrored):
  runs = [dist_keras.fit(_own_test_step_endpoint,
                         parity_task.endpoint_dataset_fn,
                         workdir=str(tmp_path / name), strategy=strategy,
                         config=dict(CONFIG, **{"train.steps": 2,
                                                "eval.every": 2}))
          for name, strategy in (("one", "one_device"), ("two", mirrored))]
  one, two = (run.summary["eval_loss"] for run in runs)
  assert 2 * two == pytest.approx(one, rel=1e-5)
