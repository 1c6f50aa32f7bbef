"""Every shipped config's train step and eval step compile with XLA, as on
a TPU.

A TPU runs each replica's step as one XLA computation: an op with no XLA
kernel, a dynamic shape or a Python side effect in the step fails there
only. `make_train_step(..., jit_compile=True)` compiles the same replica
step on the CPU, so such a problem fails here instead. One device
(OneDeviceStrategy('/cpu:0')); TFDS configs read `tfds.testing.mock_data`
(random examples of the real feature specs, nothing downloaded).
"""
import contextlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import helpers
from dist_keras import configs
from dist_keras.training import evaluation, steps
from dist_keras.data import tfds_sources
from tools import mock_tfds

# Every configs/*.py but the shared base: a new config is covered at once.
CONFIGS = configs.names()
STEPS = 2
BATCH = 8


def _layers(name):
  model = helpers.tiny_config(name).model
  return model.name, model.get("cell")


def _marked(name):
  """CI compiles one config per model and cell (the default config where it
  is one, else the first by name): the others differ in their data's
  shapes only, and CI has 15 minutes; the slow set compiles them all.
  ResNet-50's step takes 35-55 s to XLA-compile on this 2-core CPU."""
  same = sorted((n for n in CONFIGS if _layers(n) == _layers(name)),
                key=lambda n: (n != configs.DEFAULT, n))
  slow = _layers(name)[0] == "resnet50" or name != same[0]
  return pytest.param(name, marks=[pytest.mark.slow] if slow else [])


@pytest.fixture(scope="module")
def one_cpu():
  return tf.distribute.OneDeviceStrategy("/cpu:0")


def _config(name):
  """`name` shrunk like the other tests (helpers.tiny_config)."""
  c = helpers.tiny_config(name)
  c.train.global_batch_size = BATCH
  if c.model.name == "resnet50":
    c.data.image_size = 32  # Its smallest input.
  return c


def _data_source(c, tmp_path):
  """A context in which `c`'s data loads offline."""
  if not tfds_sources.is_tfds(c.data.name):
    return contextlib.nullcontext()  # Built-in, generated in memory.
  mock_tfds.write_metadata(tfds_sources.dataset_name(c.data.name),
                           str(tmp_path), 8)
  c.data.data_dir = str(tmp_path)
  return tfds.testing.mock_data(num_examples=4 * BATCH,
                                data_dir=str(tmp_path))


def _train(strategy, c, jit_compile="step"):
  """Losses of STEPS compiled train steps of config `c`."""
  with helpers.built(c, strategy) as run:
    train_step = steps.make_train_step(
        strategy, run.model, steps.StepOptions(jit=jit_compile))
    iterator = iter(run.parts.train_ds)
    return [float(train_step(iterator)["loss"]) for _ in range(STEPS)]


def test_every_config_file_is_listed():
  assert "lstm_longmem" in CONFIGS and "base" not in CONFIGS
  assert len(CONFIGS) >= 4, CONFIGS


@pytest.mark.parametrize("name", [_marked(name) for name in CONFIGS])
def test_train_step_compiles_and_learns(one_cpu, tmp_path, no_network, name):
  c = _config(name)
  with _data_source(c, tmp_path):
    losses = _train(one_cpu, c)
  assert np.all(np.isfinite(losses)), losses
  assert losses[0] != losses[1], losses  # The update reached the weights.


@pytest.mark.parametrize("name", [_marked(name) for name in CONFIGS])
def test_eval_step_compiles_to_the_same_values(one_cpu, tmp_path, no_network,
                                               name):
  """The eval's test_step through XLA, as train.jit_compile=true compiles
  it (and a TPU its whole replica step): every example once, the values of
  the eval without XLA."""
  c = _config(name)
  with _data_source(c, tmp_path), helpers.built(c, one_cpu) as run:
    results = [evaluation.evaluate(
        evaluation.make_eval_pass(one_cpu, run.model, jit),
        run.metric_state, run.parts.eval_ds) for jit in (False, True)]
  plain, compiled = ({k: v for k, v in r.items()
                      if k not in ("seconds", "traced")} for r in results)
  assert plain.keys() == compiled.keys() and plain["examples"] > 0, plain
  for key, value in plain.items():
    np.testing.assert_allclose(compiled[key], value, rtol=1e-5, atol=1e-6,
                               err_msg=key)


def test_an_uncompilable_op_fails_loudly(one_cpu, monkeypatch):
  """Proof that the replica step really is compiled: an op with no XLA
  kernel (tf.timestamp) makes it fail, where the plain step runs."""
  real = steps.forward_backward

  def with_timestamp(*args, **kwargs):
    loss, grads = real(*args, **kwargs)
    return loss + 0.0 * tf.cast(tf.timestamp(), loss.dtype), grads

  monkeypatch.setattr(steps, "forward_backward", with_timestamp)
  c = _config("lstm_longmem")
  assert len(_train(one_cpu, c, jit_compile=False)) == STEPS
  with pytest.raises(tf.errors.InvalidArgumentError, match="Timestamp"):
    _train(one_cpu, c, jit_compile="step")
  with pytest.raises(tf.errors.InvalidArgumentError, match="Timestamp"):
    _train(one_cpu, c, jit_compile=True)  # The compute alone, too.


def test_on_one_device_jit_compiles_the_update_too(one_cpu, mirrored,
                                                  monkeypatch):
  """train.jit_compile=True on one device compiles the whole untimed step,
  the optimizer's update included (as Keras' fit(jit_compile=True) does):
  an op with no XLA kernel in the update fails it there. Under Mirrored the
  update stays outside XLA (merge_call), and so do timed steps."""
  c = _config("lstm_longmem")
  with helpers.built(c, one_cpu) as run:
    real = run.model.optimizer.apply_gradients

    def with_timestamp(grads_and_vars):
      grads_and_vars = [(g + 0.0 * tf.cast(tf.timestamp(), g.dtype), v)
                        for g, v in grads_and_vars]
      return real(grads_and_vars)

    monkeypatch.setattr(run.model.optimizer, "apply_gradients", with_timestamp)
    iterator = iter(run.parts.train_ds)
    timed = steps.make_train_step(
        one_cpu, run.model, steps.StepOptions(jit=True), timed=True)
    assert np.isfinite(float(timed(iterator)["loss"]))
    whole = steps.make_train_step(one_cpu, run.model,
                                     steps.StepOptions(jit=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Timestamp"):
      whole(iterator)
  assert steps.update_compiles(one_cpu)
  assert not steps.update_compiles(mirrored)


def test_timed_steps_cannot_be_compiled_whole(one_cpu):
  c = _config("lstm_longmem")
  with helpers.built(c, one_cpu) as run, pytest.raises(
      ValueError, match="timed steps cannot be XLA-compiled"):
    steps.make_train_step(one_cpu, run.model,
                             steps.StepOptions(jit="step"), timed=True)


def test_compiled_compute_matches_the_plain_step(mirrored):
  """train.jit_compile=True under MirroredStrategy: the replicas' forward and
  backward passes compile (the all-reduce and update stay in the graph) and
  train the same weights as the plain step, timed steps included."""
  c = _config("cnn_shapes")
  c.train.optimizer = "sgd"
  weights = {}
  for jit in (False, True):
    with helpers.built(c, mirrored) as run:
      iterator = iter(run.parts.train_ds)
      for timed in (False, True):
        step = steps.make_train_step(
            mirrored, run.model, steps.StepOptions(jit=jit), timed=timed)
        out = step(iterator)
        assert np.isfinite(float(out["loss"]))
      weights[jit] = [w.numpy() for w in run.model.trainable_variables]
  for plain, compiled in zip(weights[False], weights[True]):
    np.testing.assert_allclose(plain, compiled, atol=1e-5)


# The LSTM's bfloat16 XLA compile (~25 CPU-s) in the slow set; CI compiles
# the CNN's, and every config's float32 step above.
@pytest.mark.parametrize("name", [
    pytest.param("lstm_longmem", marks=pytest.mark.slow), "cnn_shapes"])
def test_bfloat16_step_compiles_and_learns(one_cpu, name):
  """train.precision=bfloat16 (the TPU's type) through XLA on one CPU."""
  c = _config(name)
  c.train.precision = "bfloat16"
  losses = _train(one_cpu, c)
  assert np.all(np.isfinite(losses)) and losses[0] != losses[1], losses
