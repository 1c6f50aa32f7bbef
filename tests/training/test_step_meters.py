"""What the step breakdown says of time it did not split before: host time
between the calls (sync/outside_ms, of which in the users' callbacks), each
replica's own input wait where one pipeline feeds several, and the seconds
the throughput pauses out (summary.json's paused_s). Known costs are
injected (sleeps) and asserted as orderings and generous bounds: the
host is shared."""
import time

import keras
import numpy as np
import tensorflow as tf

import dist_keras
import helpers
from dist_keras.measure import stamps
from dist_keras.training import steps

FEATURES, BATCH = 8, 16


def _model_fn():
  model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4)])
  model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
  return model


def _dataset_fn(sleep_ms: float = 0.0):
  """Batches of BATCH examples per replica; each per-replica batch of the
  train split takes `sleep_ms` (tf.data's own sleep: no Python), one at a
  time, with no prefetch."""
  from tensorflow.python.data.experimental.ops import testing  # pylint: disable=g-import-not-at-top

  def dataset_fn(split, ctx):
    x = np.random.default_rng(0).normal(size=(256, FEATURES)).astype("f4")
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4]))
    ds = ds.batch(ctx.get_per_replica_batch_size(BATCH * 2),
                  drop_remainder=True)
    if split != "train":
      return ds
    ds = ds.repeat()
    if not sleep_ms:
      return ds
    # No prefetch buffer to fill while the first calls trace (seconds),
    # which later steps then read without waiting.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return ds.apply(testing.sleep(int(sleep_ms * 1e3))).with_options(options)

  return dataset_fn


def _config(**overrides) -> dict:
  return {"train.global_batch_size": BATCH * 2, "train.steps": 16,
          "train.log_every": 4, "eval.every": 0, "log.calibration_steps": 0,
          "log.progress": False, "log.sync_timing": True, **overrides}


def _fit(tmp_path, mirrored, dataset_fn, callbacks=(), **overrides):
  result = dist_keras.fit(_model_fn, dataset_fn, workdir=str(tmp_path),
                          config=_config(**overrides), strategy=mirrored,
                          callbacks=list(callbacks))
  return result.summary, helpers.scalar_tags(str(tmp_path))


SLEEP_S = 0.04


class _SlowBetweenSteps(keras.callbacks.Callback):
  """Sleeps SLEEP_S after every call (one step a call: a batch hook), and
  0.3 s as each eval begins (paused out of the throughput)."""

  def on_train_batch_end(self, batch, logs=None):
    time.sleep(SLEEP_S)

  def on_test_begin(self, logs=None):
    time.sleep(0.3)


def test_host_time_between_steps_is_logged_and_adds_up(tmp_path, mirrored):
  """A callback sleeping 40 ms a step made the wall-clock step 40 ms longer
  and the breakdown showed it nowhere (its timed step is the call alone):
  sync/outside_ms holds it, sync/callbacks_ms says it was a callback's, and
  with the step they make up the wall-clock step. The evals' sleeps are in
  summary.json's paused_s, which the throughput leaves out."""
  summary, tags = _fit(tmp_path, mirrored, _dataset_fn(),
                       [_SlowBetweenSteps()], **{"eval.every": 8})
  assert summary["outside_ms"] >= 0.8e3 * SLEEP_S, summary
  assert 0.8e3 * SLEEP_S <= summary["callbacks_ms"] <= summary["outside_ms"]
  # The eval at step 8; the final one, after the last window, is in none.
  assert summary["paused_s"] >= 0.3 * 0.9, summary
  logged = {tag: dict(tags[tag]) for tag in (
      "perf/step_ms", "sync/outside_ms", "sync/callbacks_ms", "sync/step_ms")}
  counted = sorted(logged["perf/step_ms"])  # The warm-up window left out.
  assert counted and set(counted) <= set(logged["sync/outside_ms"])
  for step in counted:
    wall, outside = logged["perf/step_ms"][step], logged["sync/outside_ms"][step]
    assert logged["sync/callbacks_ms"][step] >= 0.8e3 * SLEEP_S
    # Outside plus the time in the calls is the wall-clock step exactly;
    # the timed step is one sample of the latter (generous: a busy host).
    assert outside < wall
    assert wall - outside < 5 * logged["sync/step_ms"][step] + 20


def test_host_time_is_logged_without_timed_steps(tmp_path, mirrored):
  """With log.sync_timing off (always on a TPU) nothing of the host time
  was logged, though its clocks run anyway: now sync/outside_ms and
  sync/callbacks_ms are, and their means; the split's fields stay null."""
  summary, tags = _fit(tmp_path, mirrored, _dataset_fn(),
                       [_SlowBetweenSteps()], **{"log.sync_timing": False})
  assert 0.8e3 * SLEEP_S <= summary["callbacks_ms"] <= summary["outside_ms"]
  assert (summary["sync_split"], summary["step_ms"],
          summary["compute_ms"]) == (None, None, None)
  assert sorted(t for t in tags if t.startswith("sync")) == [
      "sync/callbacks_ms", "sync/outside_ms"]
  wall, outside = dict(tags["perf/step_ms"]), dict(tags["sync/outside_ms"])
  assert wall and sorted(wall) == sorted(outside)
  for step in wall:
    assert 0.8e3 * SLEEP_S <= outside[step] < wall[step]


def test_without_callbacks_none_of_the_host_time_is_theirs(tmp_path, mirrored):
  summary, tags = _fit(tmp_path, mirrored, _dataset_fn())
  assert summary["callbacks_ms"] == 0.0
  assert summary["outside_ms"] >= 0.0
  assert all(v == 0.0 for _, v in tags["sync/callbacks_ms"])
  assert not [t for t in tags if t.endswith(("/outside_ms", "/callbacks_ms"))
              and t.startswith("sync_replica/")]  # One host: its own only.


def test_each_replica_starts_once_its_own_batch_is_there(tmp_path, mirrored):
  """One pipeline feeds both replicas, 60 ms per replica's batch, one at a
  time: replica 0's batch is there ~60 ms before replica 1's. The timed
  step made both wait for the whole distributed batch (their input waits
  equal, and replica 0 idle), unlike the plain steps; now replica 0 starts
  on its own, and each replica's input wait is logged."""
  _, tags = _fit(tmp_path, mirrored, _dataset_fn(sleep_ms=60),
                 **{"train.steps": 12})
  first = dict(tags["sync_replica/0/input_wait_ms"])
  second = dict(tags["sync_replica/1/input_wait_ms"])
  assert sorted(first) == sorted(second) == [4, 8, 12]
  for step in first:
    assert second[step] - first[step] > 25, (first, second)
  ready = dict(tags["sync/batch_ready_ms"])
  assert all(ready[step] >= second[step] - 5 for step in ready)


def test_the_timed_step_gathers_each_replicas_input_wait_and_host_figures(
    mirrored):
  """What the chief reads of every worker's replicas (their rows under
  multi-worker): the replica's input wait from the host's stamp before the
  read, and its worker's host figures as handed to the call."""
  with mirrored.scope():
    model = _model_fn()
    model.optimizer.build(model.trainable_variables)
  dataset = mirrored.distribute_datasets_from_function(
      lambda ctx: _dataset_fn()("train", ctx))
  step = steps.make_train_step(mirrored, model, timed=True)
  out = step(iter(dataset), tf.constant([0.5, 0.25], tf.float64))
  assert out["job_rows"].shape == (2, 5)  # This worker's replicas'.
  rows = np.asarray(stamps.rows_gatherer(mirrored)(out["job_rows"]))
  assert rows.shape == (2, 5)
  np.testing.assert_array_equal(rows[:, 3:], [[0.5, 0.25]] * 2)
  stamped = np.asarray(out["stamps"])
  np.testing.assert_allclose(rows[:, 2],
                             stamped[:, 0] - float(out["step_start"]))
  assert (rows[:, 2] >= 0).all()
