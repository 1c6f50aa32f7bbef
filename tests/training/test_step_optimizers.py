"""keras.io's GANs leave their optimizers unbuilt (Keras' fit builds each at
its first apply): dist_keras builds them before training on the variables
the model's train_step hands them, traced once, and refuses those it cannot
build so (training/step_optimizers.py). That they then train as fit trains
them: tests/training/test_fit_parity.py (gan_unbuilt)."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras.errors import UserError
from dist_keras.training import compiled, lr, step_optimizers

SPEC = tf.TensorSpec([parity_task.GLOBAL_BATCH // 2, parity_task.FEATURES])
CONFIG = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
          "train.steps": 2, "log.calibration_steps": 0,
          "log.peak_tflops": 1.0, "log.progress": False}


class _Noisy(parity_task.Gan):
  """The GAN, its real samples noised with a seed generator of its own
  (whose state a step moves)."""

  def __init__(self):
    super().__init__()
    self.noise = keras.random.SeedGenerator(3)

  def train_step(self, real):
    return super().train_step(
        real + 0.01 * keras.random.normal(tf.shape(real), seed=self.noise))


class _SharedOptimizer(parity_task.Gan):
  """One optimizer for both networks: handed the discriminator's
  variables, then the generator's (Keras' fit fails at the second apply:
  its variables are unknown to the optimizer built on the first's)."""

  def __init__(self):
    super().__init__()
    self.g_optimizer = self.d_optimizer


class _Untraceable(parity_task.Gan):
  """A step that reads a tensor's value in Python: it cannot be traced."""

  def train_step(self, real):
    if float(tf.reduce_sum(real)) > 0:
      return super().train_step(real)
    return super().train_step(-real)


def _model(cls, strategy):
  with strategy.scope():
    model = cls()
    model.build((None, 2))
    model.compile()
    model.optimizer.build(model.trainable_variables)
  return model


def _state(model):
  optimizers = compiled.optimizers_of(model).values()
  return [v.numpy().copy() for v in model.variables] + [
      o.iterations.numpy() for o in optimizers]


def test_each_optimizer_is_built_on_the_variables_its_apply_is_handed(
    mirrored):
  model = _model(_Noisy, mirrored)
  before = _state(model)
  optimizers = compiled.optimizers_of(model)
  assert not model.d_optimizer.built and not model.g_optimizer.built
  assert step_optimizers.build_applied(step_optimizers.StepTrace(
      model, mirrored, optimizers, SPEC)) == {}
  for optimizer, network in [(model.d_optimizer, model.discriminator),
                             (model.g_optimizer, model.generator)]:
    assert optimizer.built
    # Adam: its iterations and rate, then a momentum and a velocity for
    # each variable it updates, shaped like it, in the replicas' scope.
    slots = optimizer.variables[2:]
    assert [tuple(s.shape) for s in slots[::2]] == [
        tuple(v.shape) for v in network.trainable_variables]
    assert all(mirrored.extended.variable_created_in_scope(s.value)
               for s in slots)
    assert not {"apply", "build"} & set(vars(optimizer))
  # Traced, not run: no weight, seed, metric or iteration count moved.
  after = _state(model)
  assert len(after) == len(before)
  for a, b in zip(after, before):
    np.testing.assert_array_equal(a, b)


def test_the_checks_and_the_build_read_one_trace_of_the_step(
    tmp_path, mirrored, monkeypatch):
  """Before training, the model's own train_step is traced once: the
  random draws' check (random_ops) and the optimizers' build read the
  same trace, which recorded what each optimizer was handed."""
  traces = []
  traced = step_optimizers.traced_step
  monkeypatch.setattr(step_optimizers, "traced_step",
                      lambda *a, **k: traces.append(a[0]) or traced(*a, **k))

  def model_fn():
    model = _Noisy()
    model.build((None, 2))
    model.compile()
    return model

  result = dist_keras.fit(model_fn, parity_task.images_dataset_fn,
                          workdir=str(tmp_path / "w"), config=CONFIG,
                          strategy=mirrored)
  assert [t.__name__ for t in traces] == ["train_step"]
  assert result.summary["steps"] == 2
  assert result.model.d_optimizer.iterations.numpy() == 2


def test_a_trace_that_failed_fails_each_reader_without_tracing_again(
    mirrored, monkeypatch):
  model = _model(_Untraceable, mirrored)
  step = step_optimizers.StepTrace(model, mirrored,
                                   compiled.optimizers_of(model), SPEC)
  traces = []
  traced = step_optimizers.traced_step
  monkeypatch.setattr(step_optimizers, "traced_step",
                      lambda *a, **k: traces.append(a) or traced(*a, **k))
  for _ in range(2):
    with pytest.raises(Exception, match="symbolic|Tensor|tensor"):
      step.own_step()
  assert len(traces) == 1


def test_a_step_that_cannot_be_traced_leaves_them_unbuilt(mirrored):
  model = _model(_Untraceable, mirrored)
  why = step_optimizers.build_applied(step_optimizers.StepTrace(
      model, mirrored, compiled.optimizers_of(model), SPEC))
  assert set(why) == {"d_optimizer", "g_optimizer"}
  assert why["d_optimizer"].startswith(
      "the model's train_step could not be traced on a batch like the train "
      "split's (")
  for optimizer in (model.d_optimizer, model.g_optimizer):
    assert not optimizer.built
    assert not {"apply", "build"} & set(vars(optimizer))


def test_an_optimizer_handed_different_variables_is_refused(tmp_path,
                                                           mirrored):
  def model_fn():
    model = _SharedOptimizer()
    model.build((None, 2))
    model.compile()
    return model

  with pytest.raises(UserError, match=(
      r"the model's d_optimizer \(Adam\) is not built and cannot be built "
      r"before training: the model's train_step hands it different "
      r"variables in different calls \(4 variable\(s\) from '.*', then 2 "
      r"variable\(s\) from '.*'\); .*call d_optimizer.build\(<the variables"
      r" it updates>\) in model_fn")):
    dist_keras.fit(model_fn, parity_task.images_dataset_fn,
                   workdir=str(tmp_path / "w"), config=CONFIG,
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")


class _CompiledParts(parity_task.Gan):
  """Its networks compiled themselves (the Keras 2 GAN habit), the
  discriminator under mixed_float16's LossScaleOptimizer (whose inner
  Adam steps through it only), beside a tuple of optimizers."""

  def __init__(self):
    super().__init__()
    self.discriminator.compile(optimizer=keras.optimizers.LossScaleOptimizer(
        self.__dict__.pop("d_optimizer")))
    self.generator.compile(optimizer=self.__dict__.pop("g_optimizer"))
    self.pair = (keras.optimizers.SGD(), self.generator.optimizer)

  def optimizers_of_step(self):
    return self.discriminator.optimizer, self.generator.optimizer


@pytest.mark.parametrize("cls,names", [
    (parity_task.Gan, ["optimizer", "d_optimizer", "g_optimizer"]),
    (parity_task.GanHeld, ["optimizer", "generator.opts['g']", "opts[0]"]),
    (_CompiledParts, ["optimizer", "generator.optimizer",
                      "discriminator.optimizer", "pair[0]"])])
def test_the_optimizers_a_model_holds_are_found_once_by_name(cls, names):
  """In a list, a tuple or a dict, on a nested sub-model, compiled by it:
  Keras tracks none of them (a layer's optimizers are no weights). In the
  order the model holds them (its checkpoint's)."""
  model = cls()
  model.compile()
  found = compiled.optimizers_of(model)
  assert list(found) == names
  assert found["optimizer"] is model.optimizer
  assert {id(o) for o in found.values()} >= {
      id(o) for o in model.optimizers_of_step()}
  assert len({id(o) for o in found.values()}) == len(names)


def test_held_optimizers_are_built_and_their_rates_logged_by_name(
    mirrored):
  model = _model(parity_task.GanHeld, mirrored)
  d_optimizer, g_optimizer = model.optimizers_of_step()
  assert step_optimizers.build_applied(step_optimizers.StepTrace(
      model, mirrored, compiled.optimizers_of(model), SPEC)) == {}
  assert d_optimizer.built and g_optimizer.built
  d_optimizer.iterations.assign(1)
  g_optimizer.iterations.assign(1)
  assert lr.logged_rates(compiled.optimizers_of(model)) == pytest.approx({
      "learning_rate/opts[0]": 1e-3,
      "learning_rate/generator.opts['g']": 1e-3})


def test_lr_scaling_is_refused_for_optimizers_held_in_a_list_or_sub_model(
    tmp_path, mirrored):
  with pytest.raises(UserError, match=(
      r"train.lr_scaling='linear' scales the compiled optimizer's learning "
      r"rate, but the model also holds generator.opts\['g'\], opts\[0\], "
      r"which it would leave as they are")):
    dist_keras.fit(parity_task.gan_held, parity_task.images_dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config={**CONFIG, "train.lr_scaling": "linear",
                           "train.base_batch_size": 24}, strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")
