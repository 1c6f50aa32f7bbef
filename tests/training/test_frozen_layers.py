"""A layer a callback freezes (trainable=False), against Keras' fit.

Fit traces its step after on_train_begin and the first on_epoch_begin and
never again: a layer frozen there stays put, one frozen later keeps
training. dist_keras' step reads the trainable variables as it traces too
(training/trained_set.py): its gradients and its update are of one list, at
any replica count; a run resumed after a freeze traces after it, as fit
resumed there would. The three hidden layers have equal shapes, so a
gradient paired with the wrong layer's variable fails nothing.
"""
import functools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras.errors import UserError

EPOCH, EPOCHS, WIDTH = 4, 3, parity_task.FEATURES
CONFIG = {"train.steps": EPOCH * EPOCHS, "train.global_batch_size": 48,
          "train.log_every": EPOCH, "train.checkpoint_every": EPOCH,
          "eval.every": EPOCH, "eval.steps": 2, "log.progress": False,
          "log.tensorboard": False, "log.calibration_steps": 0,
          "log.sync_timing": False, "log.peak_tflops": 1.0}
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")
LAYERS = ("d1", "d2", "d3")


def model_fn(frozen=(), ema=False):
  """Three Dense of WIDTH x WIDTH kernels; `frozen` ones before compile;
  with `ema`, the optimizer's averages overwrite the weights every 3
  steps and as training ends."""
  inputs = keras.Input((WIDTH,))
  x = inputs
  for name in LAYERS:
    layer = keras.layers.Dense(WIDTH, activation="tanh", name=name)
    layer.trainable = name not in frozen
    x = layer(x)
  model = keras.Model(inputs, x)
  model.compile(optimizer=keras.optimizers.SGD(
      0.1, use_ema=ema, ema_overwrite_frequency=3 if ema else None),
                loss="mse")
  return model


def dataset_fn(split, input_context):
  return parity_task.dataset_fn(split, input_context).map(
      lambda x, y: (x, tf.tile(y, [1, WIDTH])))


class Freeze(keras.callbacks.Callback):
  """Sets `names`' trainable to `trainable` in on_train_begin (epoch None)
  or in on_epoch_begin(epoch)."""

  def __init__(self, names, epoch=None, trainable=False):
    super().__init__()
    self.names, self.epoch, self.trainable = names, epoch, trainable

  def _set(self):
    for name in self.names:
      self.model.get_layer(name).trainable = self.trainable

  def on_train_begin(self, logs=None):
    if self.epoch is None:
      self._set()

  def on_epoch_begin(self, epoch, logs=None):
    if epoch == self.epoch:
      self._set()


class Interrupted(Exception):
  pass


class Snapshot(keras.callbacks.Callback):
  """Keeps the weights at each epoch's end; raises after step `stop_at`
  (nothing since the last checkpoint is saved)."""

  def __init__(self, stop_at=0):
    super().__init__()
    self.stop_at, self.steps, self.weights = stop_at, 0, {}

  def on_epoch_end(self, epoch, logs=None):
    self.weights[epoch] = self.model.get_weights()

  def on_train_batch_end(self, batch, logs=None):
    self.steps += 1
    if self.steps == self.stop_at:
      raise Interrupted(f"after step {self.steps}")


def _fit(callbacks, weights=None, initial_epoch=0, make=model_fn):
  """Keras' fit on one device, the same batches from `initial_epoch` on,
  from `weights` (SGD keeps no slots: the weights are its whole state)."""
  keras.utils.set_random_seed(0)
  model = make()
  if weights is not None:
    model.set_weights(weights)
  batches = dataset_fn("train", tf.distribute.InputContext()).skip(
      initial_epoch * EPOCH)
  history = model.fit(batches, epochs=EPOCHS, initial_epoch=initial_epoch,
                      steps_per_epoch=EPOCH, verbose=0, shuffle=False,
                      callbacks=callbacks)
  return model, history.history


def _ours(workdir, callbacks, strategy=ONE_CPU, make=model_fn, **config):
  return dist_keras.fit(make, dataset_fn, workdir=str(workdir),
                        config={**CONFIG, **config}, strategy=strategy,
                        callbacks=callbacks)


def _same_weights(got, want, atol):
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def _initial():
  keras.utils.set_random_seed(0)
  return model_fn().get_weights()


@pytest.mark.parametrize("ema", [False, True])
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_layer_frozen_in_on_train_begin_trains_as_under_fit(
    tmp_path, mirrored, replicas, ema):
  """With EMA, the averages (of every variable trainable in model_fn) are
  swapped in as training ends: each into its own variable."""
  make = functools.partial(model_fn, ema=ema)
  want, _ = _fit([Freeze(["d1"])], make=make)
  got = _ours(tmp_path, [Freeze(["d1"])],
              ONE_CPU if replicas == 1 else mirrored, make).model
  _same_weights(got.get_weights(), want.get_weights(), 1e-6)
  start = _initial()
  _same_weights(got.get_layer("d1").get_weights(), start[:2], 0.0)
  assert not np.allclose(got.get_layer("d2").kernel.numpy(), start[2])


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_layer_frozen_in_on_train_begin_trains_nothing_as_fit(
    tmp_path, mirrored, replicas):
  """Fit's step applies nothing; the losses are still the model's."""
  _, want = _fit([Freeze(LAYERS)])
  got = _ours(tmp_path, [Freeze(LAYERS)],
              ONE_CPU if replicas == 1 else mirrored)
  _same_weights(got.model.get_weights(), _initial(), 0.0)
  np.testing.assert_allclose(got.history["loss"], want["loss"],
                             rtol=1e-6)


def test_a_layer_frozen_after_the_trace_keeps_training_and_is_said(
    tmp_path, capsys):
  want, _ = _fit([Freeze(["d1"], epoch=1)])
  got = _ours(tmp_path, [Freeze(["d1"], epoch=1)], **{"log.progress": True})
  _same_weights(got.model.get_weights(), want.get_weights(), 1e-6)
  lines = [line for line in capsys.readouterr().out.splitlines()
           if "after the step was traced" in line]
  assert len(lines) == 1, lines
  assert re.fullmatch(
      r"variable '(\S+/)?d1/kernel' \(and 1 more\) was frozen after the step "
      "was traced: it keeps training, as under Keras' fit; freeze it in "
      "model_fn or on_train_begin", lines[0]), lines[0]


class FreezeAfterStep(keras.callbacks.Callback):
  """Freezes d1 after the first step (a timed one: dist_keras' plain steps
  are another function, traced at the second)."""

  def on_train_batch_end(self, batch, logs=None):
    self.model.get_layer("d1").trainable = False


def test_a_layer_frozen_between_the_first_two_steps_trains_as_under_fit(
    tmp_path):
  """Fit traces one function, at step 1: d1 trains on."""
  want, _ = _fit([FreezeAfterStep()])
  got = _ours(tmp_path, [FreezeAfterStep()], **{"log.sync_timing": True})
  _same_weights(got.model.get_weights(), want.get_weights(), 1e-6)


def test_a_run_resumed_after_a_freeze_trains_as_fit_resumed_there(tmp_path):
  """Stopped after step 10, in epoch 2, which froze d1 after the trace;
  resumed from step 8, it traces after the freeze: d1 stays at step 8's
  weights, as fit resumed at epoch 2 (BackupAndRestore) leaves it."""
  snapshot = Snapshot(stop_at=10)
  with pytest.raises(Interrupted):
    _ours(tmp_path, [Freeze(["d1"], epoch=2), snapshot])
  at_8 = snapshot.weights[1]
  got = _ours(tmp_path, [Freeze(["d1"], epoch=2)]).model
  want, _ = _fit([Freeze(["d1"], epoch=2)], weights=at_8, initial_epoch=2)
  _same_weights(got.get_weights(), want.get_weights(), 1e-6)
  _same_weights(got.get_layer("d1").get_weights(), at_8[:2], 0.0)


def test_a_layer_made_trainable_after_model_fn_is_refused(tmp_path):
  """The optimizer is built on the variables trainable when model_fn
  returns, before the callbacks run (Keras' fit under a strategy builds it
  there too, and fails at its first update: "Unknown variable")."""
  with pytest.raises(UserError, match=(
      r"^variable '(\S+/)?d1/kernel' of model '\S+' was made trainable "
      "after model_fn returned: .* freeze it in a callback's on_train_begin"
      r" instead\.$")):
    dist_keras.fit(lambda: model_fn(frozen=("d1",)), dataset_fn,
                   workdir=str(tmp_path), config=CONFIG, strategy=ONE_CPU,
                   callbacks=[Freeze(["d1"], trainable=True)])
