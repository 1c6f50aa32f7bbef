"""Each replica draws its own random numbers (training/replica_seeds.py).

Keras' SeedGenerator state has a copy per replica, made and stepped alike:
without dist_keras folding the replica id in, 2 replicas applied the same
Dropout mask and drew the same noise (a GAN's latents), where one device
draws a new number for every example. Models: tests/random_task.py.
"""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
import parity_weights
import random_task
from dist_keras.training import replica_seeds

KERAS_NEXT = keras.random.SeedGenerator.next


def _fit(name, workdir, strategy, **config):
  settings = {k: v for k, v in parity_weights.config(
      name, 1, "one_device").items() if not k.startswith("runtime.")}
  return dist_keras.fit(getattr(random_task, name), parity_task.dataset_fn,
                        workdir=str(workdir), strategy=strategy,
                        config={**settings, "eval.every": 6, **config})


def _kept_masks(strategy, model):
  kept = model.get_layer("kept_dropout").kept.value
  return [v.numpy() for v in strategy.experimental_local_results(kept)]


# Timed steps too: the sync breakdown's step function draws as the plain one.
TIMED = {"log.sync_timing": True}


@pytest.fixture(scope="module")
def dropout_run(tmp_path_factory, mirrored):
  """dropout_noise's 12 steps on 2 replicas, shared by the tests that read
  its masks (an in-process run is ~5-10 CPU-s)."""
  return _fit("dropout_noise", tmp_path_factory.mktemp("whole"), mirrored,
              **TIMED)


def test_each_replica_applies_its_own_dropout_mask(dropout_run, mirrored):
  """A compiled model's Dropout (dist_keras' own step, timed and not):
  the two replicas' masks differ; Keras' SeedGenerator is its own again
  after the run."""
  first, second = _kept_masks(mirrored, dropout_run.model)
  assert set(np.unique(first)) == {0.0, 2.0}, first  # Masks were kept.
  assert not np.array_equal(first, second), "both replicas drew one mask"
  assert keras.random.SeedGenerator.next is KERAS_NEXT


def test_each_replica_draws_its_own_noise_in_its_own_steps(tmp_path,
                                                           mirrored):
  """A model's own train_step (a GAN's latents: keras.random.normal from
  the model's SeedGenerator; a Dropout mask) and test_step: every step,
  the two replicas drew different numbers."""
  history = _fit("noisy_step", tmp_path, mirrored).history
  assert history["same_noise"] == [0.0, 0.0], history
  assert history["same_mask"] == [0.0, 0.0], history
  assert history["val_same_noise"] == [0.0, 0.0], history


def test_two_workers_draw_their_own_noise(tmp_path):
  """Across 2 worker processes (a replica each, ids counted over the
  workers): the two replicas' noise and masks differ, in train and eval."""
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, f"{helpers.REPO}/tools/launch_local.py",
       "--num_workers=2", "--", sys.executable, "-m", "dist_keras.train",
       f"--workdir={workdir}", "--config.model.name=random_task:noisy_step",
       "--config.data.name=parity_task:dataset_fn",
       "--config.train.global_batch_size=48", "--config.train.steps=6",
       "--config.eval.every=3", "--config.log.calibration_steps=0",
       "--config.log.peak_tflops=1.0"], capture_output=True, text=True,
      timeout=600, check=False, env=dict(
          os.environ, TF_CPP_MIN_LOG_LEVEL="2",
          PYTHONPATH=f"{helpers.REPO}:{helpers.TESTS}"))
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["replicas"] == 2, summary
  drew = {key: summary[key] for key in (
      "train_same_noise", "train_same_mask", "eval_same_noise")}
  assert drew == dict.fromkeys(drew, 0.0), drew


@pytest.mark.parametrize("name", ["dropout_noise", "noisy_step"])
def test_one_device_draws_what_keras_fit_draws(tmp_path, name):
  """One device is unchanged: the same masks and noise as Keras' fit, its
  eval after each 6 steps included (noisy_step's draws too), so the same
  weights, bitwise."""
  keras.utils.set_random_seed(0)
  model = getattr(random_task, name)()
  one_pipeline = tf.distribute.InputContext()
  model.fit(parity_task.dataset_fn("train", one_pipeline), epochs=2,
            steps_per_epoch=parity_weights.STEPS // 2, verbose=0,
            shuffle=False,
            validation_data=parity_task.dataset_fn("eval", one_pipeline))
  one = _fit(name, tmp_path, tf.distribute.OneDeviceStrategy("/cpu:0"))
  for expected, got in zip(model.weights, one.model.weights):
    np.testing.assert_array_equal(got.numpy(), expected.numpy(),
                                  err_msg=expected.path)


def test_a_resumed_run_draws_what_the_uninterrupted_one_draws(
    tmp_path, mirrored, dropout_run):
  """2 replicas stopped at step 6 and run on to 12 end with the
  uninterrupted run's weights and masks: the seed state is checkpointed
  and each replica folds its id into it alike."""
  whole = dropout_run
  _fit("dropout_noise", tmp_path / "resumed", mirrored, **{
      "train.steps": 6, "train.checkpoint_every": 6, **TIMED})
  resumed = _fit("dropout_noise", tmp_path / "resumed", mirrored, **TIMED)
  for expected, got in zip(whole.model.weights, resumed.model.weights):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0,
                               atol=1e-6, err_msg=expected.path)
  for expected, got in zip(_kept_masks(mirrored, whole.model),
                           _kept_masks(mirrored, resumed.model)):
    np.testing.assert_array_equal(got, expected)


def test_a_keras_draw_goes_through_seed_generator_next(mirrored):
  """What replica_seeds replaces: a Keras release that draws its seeds
  elsewhere would have every replica draw alike again."""
  generator = keras.random.SeedGenerator(7)

  @tf.function
  def draw():
    return mirrored.run(replica_seeds.per_replica(
        lambda: keras.random.uniform((4,), seed=generator)))

  first, second = mirrored.experimental_local_results(draw())
  assert not np.array_equal(first, second), (
      "Keras no longer draws through SeedGenerator.next: "
      "dist_keras/training/replica_seeds.py must follow it")
  assert keras.random.SeedGenerator.next is KERAS_NEXT


def test_replica_zero_keeps_the_seed_and_the_others_fold_their_id_in():
  """Replica 0 draws Keras' seed itself; replica r its own, the same
  whether r is a constant (MirroredStrategy) or a tensor (a TPU's), and
  under XLA."""
  seed = tf.constant([1337, 4], tf.int64)
  assert replica_seeds.folded(seed, tf.constant(0)) is seed
  static = [replica_seeds.folded(seed, tf.constant(r)).numpy()
            for r in (1, 2, 3)]
  assert len({tuple(s) for s in static + [seed.numpy()]}) == 4, static
  as_tensor = tf.function(replica_seeds.folded, jit_compile=True)
  for r in range(4):
    expected = static[r - 1] if r else seed.numpy()
    got = as_tensor(seed, tf.Variable(r)).numpy()
    np.testing.assert_array_equal(got, expected)
