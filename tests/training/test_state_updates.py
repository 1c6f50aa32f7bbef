"""A model's own state per batch at 2 replicas (training/state_updates.py,
training/own_losses.py): a variable its layer assigns in the training call
and a loss it adds itself (add_loss), each either one device's at N
replicas or refused (or, for a replica's own statistic, said).

Silent before: a counter of aggregation "sum" read 8190 after 12 steps at
2 replicas (each step 2 x (count + 1)); an add_loss summing over the batch
was divided by the replicas once too many (weights 0.0128 off one device).
"""
import contextlib
import functools
import io

import keras
import numpy as np
import pytest
from keras import ops

import dist_keras
import parity_task
from dist_keras.errors import UserError

STEPS = 12
CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": STEPS, "train.log_every": STEPS, "eval.every": 0,
          "log.calibration_steps": 0, "log.tensorboard": False}


class Tracks(keras.layers.Layer):
  """Counts its training calls and keeps a running mean of its input (it
  feeds nothing), both of aggregation `aggregation`; `in_training`:
  False updates them in inference only (as the eval runs it)."""

  def __init__(self, aggregation="mean", in_training=True, **kwargs):
    super().__init__(**kwargs)
    self.aggregation, self.in_training = aggregation, in_training

  def build(self, shape):
    self.count = self.add_weight(shape=(), initializer="zeros",
                                 trainable=False, name="count",
                                 aggregation=self.aggregation)
    self.mean = self.add_weight(shape=(shape[-1],), initializer="zeros",
                                trainable=False, name="mean",
                                aggregation=self.aggregation)

  def call(self, x, training=None):
    if bool(training) == self.in_training:
      self.count.assign_add(1.0)
      self.mean.assign(0.9 * self.mean + 0.1 * ops.mean(x, axis=0))
    return x


class Penalty(keras.layers.Layer):
  """An activation penalty of its own: a mean or a sum over the batch."""

  def __init__(self, how="mean", **kwargs):
    super().__init__(**kwargs)
    self.how = how

  def call(self, x):
    per_example = ops.sum(ops.square(x), axis=-1)
    if self.how == "mean":
      self.add_loss(0.1 * ops.mean(per_example))
    else:
      self.add_loss(0.1 / parity_task.GLOBAL_BATCH * ops.sum(per_example))
    return x


def _model(layer_fn, how="mean"):
  model = keras.Sequential([
      keras.Input((parity_task.FEATURES,)), layer_fn(name="own"),
      keras.layers.Dense(8, activation="tanh"), Penalty(how, name="penalty"),
      keras.layers.Dense(1)], name="tracked")  # (Its variables' paths.)
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


def _fit(layer_fn, strategy, workdir):
  return dist_keras.fit(functools.partial(_model, layer_fn),
                        parity_task.dataset_fn, workdir=str(workdir),
                        config=CONFIG, strategy=strategy)


def _assert_same(one, two, weights="weights"):
  for a, b in zip(getattr(one.model, weights), getattr(two.model, weights)):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-5,
                               err_msg=a.path)


def test_a_sum_variable_the_training_call_assigns_is_refused(
    tmp_path, mirrored):
  """Its counter would double every step at 2 replicas; one device counts
  12 (trained as compiled)."""
  with pytest.raises(UserError, match=(
      r"^variable 'tracked/own/count' has aggregation=\"sum\" and the "
      r"model's training call assigns it: each of the 2 replicas assigns "
      r"its own new value and the variable takes their sum \(a counter of "
      r"assign_add\(1\) doubles every step: .* create it with "
      r"aggregation=\"mean\" .*, count in a callback on the host, or train"
      r" on one replica \(runtime.strategy=one_device\)")):
    _fit(functools.partial(Tracks, "sum"), mirrored, tmp_path / "two")
  assert not (tmp_path / "two").exists()
  one = _fit(functools.partial(Tracks, "sum"), "one_device", tmp_path / "one")
  assert float(one.model.get_layer("own").count.numpy()) == STEPS


@pytest.fixture(scope="module")
def mean_runs(tmp_path_factory, mirrored):
  """(one device's run, 2 replicas' run, what both printed) of the
  model whose counter and running mean have aggregation="mean" and whose
  own loss is a mean over the batch: two tests read the same two runs."""
  folder = tmp_path_factory.mktemp("mean_runs")
  model_fn = functools.partial(_penalty_model, "mean")
  with _stdout() as said:
    one, two = (dist_keras.fit(model_fn, parity_task.dataset_fn,
                               workdir=str(folder / name), config=CONFIG,
                               strategy=strategy)
                for name, strategy in (("one", "one_device"),
                                       ("two", mirrored)))
  return one, two, said.getvalue()


@contextlib.contextmanager
def _stdout():
  """What the run prints (capsys is per test: the fixture is per module)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    yield out


def test_a_mean_variable_keeps_one_devices_count_and_running_mean(
    mean_runs):
  """aggregation="mean": the replicas' mean of their counts and running
  means is one device's; nothing is said."""
  one, two, said = mean_runs
  _assert_same(one, two)
  assert float(two.model.get_layer("own").count.numpy()) == STEPS
  assert "is assigned from the batch" not in said


def test_a_replicas_own_statistic_is_said_and_a_counter_is_not(
    tmp_path, mirrored, capsys):
  """aggregation="none" (Keras' default): each replica's running mean is
  of its own half batch, said at the start at 2 replicas only; the
  counter, from no batch, is one device's on each replica."""
  layer_fn = functools.partial(Tracks, "none")
  one = _fit(layer_fn, "one_device", tmp_path / "one")
  said_one = capsys.readouterr().out
  two = _fit(layer_fn, mirrored, tmp_path / "two")
  said_two = capsys.readouterr().out
  assert "is assigned from the batch" not in said_one
  assert said_two.count(
      "variable 'tracked/own/mean' (aggregation='none') is assigned from"
      " the batch in the model's training call: each of the 2 replicas "
      "computes it from its own share of the batch and each replica keeps "
      "its own") == 1, said_two
  assert "tracked/own/count" not in said_two
  assert float(two.model.get_layer("own").count.numpy()) == STEPS
  assert not np.allclose(two.model.get_layer("own").mean.numpy(),
                         one.model.get_layer("own").mean.numpy(), atol=1e-3)


def test_a_sum_variable_updated_in_inference_only_trains(tmp_path,
                                                         mirrored):
  """The eval's updates are not the training call's: trained as compiled
  (its counter then counts as under fit with MirroredStrategy)."""
  layer_fn = functools.partial(Tracks, "sum", in_training=False)
  one = _fit(layer_fn, "one_device", tmp_path / "one")
  two = _fit(layer_fn, mirrored, tmp_path / "two")
  _assert_same(one, two, "trainable_weights")


def _penalty_model(how):
  return _model(functools.partial(Tracks, "mean"), how)


def test_an_own_loss_summing_over_the_batch_is_refused(tmp_path, mirrored):
  """Keras divides it by the replicas as every own loss: at 2 replicas it
  trained on half of it. A mean over the batch trains one device's."""
  model_fn = functools.partial(_penalty_model, "sum")
  with pytest.raises(UserError, match=(
      r"^the own loss of layer 'penalty' \(add_loss in its call\) sums "
      r"over the batch \(a batch repeated twice gives .*\), and Keras "
      r"divides every loss of the model's own by the 2 replicas .* add a "
      r"mean over the replica's batch \(ops.mean instead of ops.sum")):
    dist_keras.fit(model_fn, parity_task.dataset_fn,
                   workdir=str(tmp_path / "two"), config=CONFIG,
                   strategy=mirrored)
  assert not (tmp_path / "two").exists()
  dist_keras.fit(model_fn, parity_task.dataset_fn,
                 workdir=str(tmp_path / "one"), config=CONFIG,
                 strategy="one_device")


def test_an_own_loss_averaging_over_the_batch_trains_one_devices(
    mean_runs):
  """(mean_runs' model: its own loss is a mean over the batch.)"""
  one, two, _ = mean_runs
  _assert_same(one, two)
