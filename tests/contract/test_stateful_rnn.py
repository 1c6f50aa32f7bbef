"""A stateful RNN (LSTM(stateful=True)): it keeps a state row per example
of the batch it was built for, carried from step to step, and through the
eval, as Keras' fit carries it (fit resets nothing by itself). Built for
each replica's batch it trains as fit; built for the global batch (one
device's habit) at 2 replicas it is refused before anything is written.
Keras keeps its states out of the model's variables: each checkpoint holds
them as one device would (training/rnn_states.py), so a resume goes on
with the states it stopped with, at 1 and 2 replicas, 2 workers, and from
2 replicas on one device."""
import functools
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
from dist_keras.errors import UserError
from dist_keras.training import checkpoints

GLOBAL, STEPS, TIME = 8, 4, 5
CONFIG = {"train.global_batch_size": GLOBAL, "train.steps": 2 * STEPS,
          "eval.every": STEPS, "train.log_every": STEPS,
          "log.calibration_steps": 0, "log.tensorboard": False,
          "log.sync_timing": False, "log.progress": False}


def _model_fn(batch=None):
  """Built for `batch`, or for each replica's share of GLOBAL."""
  batch = batch or GLOBAL // tf.distribute.get_strategy().num_replicas_in_sync
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input(batch_shape=(batch, TIME, 2)),
                            keras.layers.LSTM(4, stateful=True, name="lstm"),
                            keras.layers.Dense(1)], name="stateful")
  model.compile(keras.optimizers.Adam(0.01), "mse")
  return model


def _dataset_fn(split, ctx):
  """A step's replica batches are one device's batch, split in rows: each
  replica's state rows are one device's."""
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.normal(size=(GLOBAL * STEPS, TIME, 2)).astype("float32")
  y = x.sum(axis=(1, 2))[:, None]
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  ds = ds.repeat() if split == "train" else ds
  ds = ds.batch(ctx.get_per_replica_batch_size(GLOBAL), drop_remainder=True)
  return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


class _ResetEachBatch(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    self.model.get_layer("lstm").reset_state()


@functools.cache
def _fit(reset_each_batch=False):
  """Keras' fit on one device: 2 epochs, an eval between them."""
  callbacks = [_ResetEachBatch()] if reset_each_batch else []
  model = _model_fn()
  one = tf.distribute.InputContext()
  history = model.fit(_dataset_fn("train", one), epochs=2,
                      steps_per_epoch=STEPS, verbose=0, shuffle=False,
                      validation_data=_dataset_fn("eval", one),
                      callbacks=callbacks)
  return model.get_weights(), history.history


def test_a_stateful_rnn_carries_its_state_as_fit_carries_it(
    tmp_path, mirrored):
  """The state carries over steps (reset each batch, fit's losses differ)
  and through the eval (its batches move it on, as under fit)."""
  result = dist_keras.fit(_model_fn, _dataset_fn, workdir=str(tmp_path),
                          config=CONFIG, strategy=mirrored)
  weights, history = _fit()
  _, reset = _fit(reset_each_batch=True)
  assert abs(reset["loss"][0] - history["loss"][0]) > 1e-3
  for key in ("loss", "val_loss"):
    np.testing.assert_allclose(result.history[key], history[key], rtol=1e-5)
  for got, want in zip(result.model.get_weights(), weights):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_stateful_rnn_built_for_the_global_batch_is_refused(
    tmp_path, mirrored):
  """It failed the first step (Keras' "If an RNN is stateful, the batch
  size ..."), leaving config.json and TensorBoard's events behind."""
  with pytest.raises(UserError, match=(
      "^layer 'lstm' of model 'stateful' is a stateful RNN built for "
      r"batches of 8, but each of the 2 replicas gets batches of 4 \("
      r"train.global_batch_size=8 / 2\); build it for the per-replica batch "
      r"in model_fn: keras.Input\(batch_shape=\(global_batch_size // "
      r"tf.distribute.get_strategy\(\).num_replicas_in_sync, ...\)\).$")):
    dist_keras.fit(lambda: _model_fn(GLOBAL), _dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config={**CONFIG, "log.tensorboard": True},
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")


# Resume: 12 steps, an eval and a checkpoint every 6, stopped at 6.
RESUME = {**CONFIG, "train.steps": 12, "eval.every": 6,
          "train.checkpoint_every": 6, "train.log_every": 6}
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")


def _run(workdir, strategy, steps=12, callbacks=(), **config):
  return dist_keras.fit(_model_fn, _dataset_fn, workdir=str(workdir),
                        config={**RESUME, "train.steps": steps, **config},
                        strategy=strategy, callbacks=list(callbacks))


class _AtStart(keras.callbacks.Callback):
  """The states as training begins (after the restore)."""

  def on_train_begin(self, logs=None):
    self.states = _states(self.model)


def _states(model):
  """Each state of layer 'lstm' as one device holds it: the replicas'
  rows, concatenated in replica order."""
  strategy = model.distribute_strategy
  return [np.concatenate([t.numpy() for t in
                          strategy.experimental_local_results(v.value)])
          for v in model.get_layer("lstm").states]


def _assert_same(got, want, atol):
  for a, b in zip(got.model.weights, want.model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=atol,
                               err_msg=b.path)
  for a, b in zip(_states(got.model), _states(want.model), strict=True):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg="states")


def _held(workdir, step):
  """The states checkpoint ckpt-STEP holds."""
  reader = tf.train.load_checkpoint(f"{workdir}/checkpoints/ckpt-{step}")
  return [reader.get_tensor(f"rnn_states/{i}/.ATTRIBUTES/VARIABLE_VALUE")
          for i in range(2)]


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, mirrored):
  """The 2 replicas' runs several tests start from (each ~2 fits' worth):
  'whole', 12 steps, and 'at_6', stopped at 6 (a test goes on from a copy
  of its workdir, `from_6`)."""
  folder = tmp_path_factory.mktemp("two_replicas")
  runs = {"whole": _run(folder / "whole", mirrored),
          "at_6": _run(folder / "at_6", mirrored, steps=6)}

  def from_6(workdir):
    shutil.copytree(folder / "at_6", workdir)
    return workdir

  return {**runs, "folder": folder, "from_6": from_6}


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_resumed_run_goes_on_with_the_states_it_stopped_with(
    tmp_path, mirrored, replicas, request):
  """Stopped at step 6 and resumed, it ends where the uninterrupted run
  ends, weights and states (they restarted at zero: 0.019 apart on one
  device); every checkpoint holds the global batch's rows, one device's."""
  strategy = mirrored if replicas == 2 else ONE_CPU
  if replicas == 2:  # The shared runs (a fixture of 2 replicas only).
    shared = request.getfixturevalue("two_replicas")
    whole, whole_dir = shared["whole"], shared["folder"] / "whole"
    resumed_dir = shared["from_6"](tmp_path / "resumed")
  else:
    whole, whole_dir = _run(tmp_path / "whole", strategy), tmp_path / "whole"
    resumed_dir = tmp_path / "resumed"
    _run(resumed_dir, strategy, steps=6)
  for got, want in zip(_held(whole_dir, 12), _states(whole.model),
                       strict=True):
    assert got.shape == (GLOBAL, 4)
    np.testing.assert_array_equal(got, want)
  start = _AtStart()
  resumed = _run(resumed_dir, strategy, callbacks=[start])
  for got, want in zip(start.states, _held(resumed_dir, 6), strict=True):
    np.testing.assert_array_equal(got, want)
  _assert_same(resumed, whole, atol=1e-6)


def test_a_checkpoint_of_2_replicas_resumes_on_one_device(
    tmp_path, two_replicas):
  """Each replica's rows, saved as one device's batch, go back as one
  device's: it ends where the 2 replicas' whole run ends (2 replicas = one
  device to 1e-5: the first test)."""
  moved = _run(two_replicas["from_6"](tmp_path / "moved"), ONE_CPU)
  _assert_same(moved, two_replicas["whole"], atol=1e-5)


def test_a_checkpoint_without_states_resumes_them_at_zero(
    tmp_path, mirrored, monkeypatch, capsys):
  """One saved before checkpoints held the states (its stateful layers
  unseen) restores, says so in one line, and the states start at zero,
  as they did."""
  with monkeypatch.context() as before:
    before.setattr("dist_keras.contract.checks.stateful_layers",
                   lambda model: [])
    _run(tmp_path / "old", mirrored, steps=6)
  capsys.readouterr()
  start = _AtStart()
  _run(tmp_path / "old", mirrored, callbacks=[start],
       **{"log.progress": True})
  assert ("resumed from ckpt-6 at step 6; ckpt-6 holds no states of the "
          "stateful RNN layer 'lstm' (saved before dist_keras kept them): "
          "they start at zero\n") in capsys.readouterr().out
  assert not np.any(start.states), start.states


def test_the_calibration_leaves_the_states_as_training_left_them(
    tmp_path, mirrored, two_replicas):
  """Its steps after the last (log.calibration_steps, 20 by default) moved
  them on: the model returned was 1.36 off a run without them."""
  plain = two_replicas["at_6"]
  timed = _run(tmp_path / "timed", mirrored, steps=6,
               **{"log.calibration_steps": 4})
  for got, want in zip(_states(timed.model), _states(plain.model),
                       strict=True):
    np.testing.assert_array_equal(got, want)


def _saved_at_6(workdir, model):
  """ckpt-6 of `model` (built outside a strategy: one device) in workdir."""
  saved = checkpoints.Checkpoints(str(workdir), model, {}, True, 3)
  saved.save(6)
  saved.close()
  return tf.train.load_checkpoint(f"{workdir}/checkpoints/ckpt-6")


def test_a_model_without_a_stateful_rnn_saves_what_it_saved(tmp_path):
  """No states, no variable for them, nothing gathered."""
  model = keras.Sequential([keras.Input((TIME, 2)), keras.layers.LSTM(4),
                            keras.layers.Dense(1)])
  names = _saved_at_6(tmp_path, model).get_variable_to_shape_map()
  assert not [name for name in names if name.startswith("rnn_states")]
  assert {name.split("/")[0] for name in names} == {
      "_CHECKPOINTABLE_OBJECT_GRAPH", "model_variables", "record",
      "save_counter", "step", "stopped"}


def test_states_saved_for_another_global_batch_start_at_zero(tmp_path):
  """A row per example cannot be re-split for another batch: one line,
  and the states are zero, not the ones before the restore."""
  _saved_at_6(tmp_path, _model_fn(GLOBAL))
  model = _model_fn(GLOBAL // 2)
  for state in model.get_layer("lstm").states:
    state.assign(np.ones(state.shape, "float32"))
  resumed = checkpoints.Checkpoints(str(tmp_path), model, {}, True, 3)
  line = resumed.restore(checkpoints.find_resume(str(tmp_path)))
  resumed.close()
  assert line == ("resumed from ckpt-6 at step 6; ckpt-6 holds the states "
                  "of the stateful RNN layer 'lstm' for a global batch of "
                  "8, not 4: they start at zero")
  assert not np.any(_states(model))


def _two_workers(workdir, steps):
  """2 workers (a replica each) through the launcher, as users start them."""
  settings = {**RESUME, "train.steps": steps, "log.peak_tflops": 1.0}
  result = subprocess.run(
      [sys.executable, f"{helpers.REPO}/tools/launch_local.py",
       "--num_workers=2", "--", sys.executable, "-m", "dist_keras.train",
       f"--workdir={workdir}",
       "--config.model.name=test_stateful_rnn:_model_fn",
       "--config.data.name=test_stateful_rnn:_dataset_fn",
       *[f"--config.{key}={value}" for key, value in settings.items()]],
      capture_output=True, text=True, timeout=600, check=False, env=dict(
          os.environ, TF_CPP_MIN_LOG_LEVEL="2",
          PYTHONPATH=":".join([helpers.REPO, helpers.TESTS,
                                os.path.dirname(__file__)])))
  assert result.returncode == 0, result.stderr[-3000:]
  reader = tf.train.load_checkpoint(f"{workdir}/checkpoints")  # Newest.
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if not name.startswith(("_CHECKPOINTABLE", "save_counter",
                                  "record/"))}


@pytest.mark.slow
def test_two_workers_resume_with_the_states_they_stopped_with(tmp_path):
  """Each worker's rows reach the chief's checkpoint (an all-gather as
  they save), one device's there, and go back to their worker: stopped at
  6 and resumed, the 2 workers end where their uninterrupted run ends."""
  whole = _two_workers(tmp_path / "whole", 12)
  _two_workers(tmp_path / "resumed", 6)
  resumed = _two_workers(tmp_path / "resumed", 12)
  assert resumed.keys() == whole.keys()
  one = _run(tmp_path / "one", ONE_CPU)  # Its rows, in replica order.
  for i, state in enumerate(_states(one.model)):
    np.testing.assert_allclose(
        whole[f"rnn_states/{i}/.ATTRIBUTES/VARIABLE_VALUE"], state, rtol=0,
        atol=1e-5)
  for name, value in whole.items():
    np.testing.assert_allclose(resumed[name], value, rtol=0, atol=1e-6,
                               err_msg=name)
