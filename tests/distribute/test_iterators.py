"""A finished run's train iterator is destroyed off its caller's thread
(distribute/iterators.py): destroying an autotuned one waits until tf.data's
autotune thread next wakes (TF 2.21: 0-60 s, at random), and fit returned
only after it. user_task.slow_closing_dataset_fn's iterator takes a fixed
time to destroy instead, so the tests do not depend on that chance.
"""
import threading
import time

import keras

import dist_keras
import helpers
import user_task

_DROPPING_THREAD = "dist_keras-drop-iterators"


class _Ended(keras.callbacks.Callback):
  """When training ended: the last callback's on_train_end."""

  def on_train_end(self, logs=None):
    self.at = time.monotonic()


def test_fit_returns_without_waiting_for_its_train_iterator(tmp_path,
                                                            mirrored):
  """2 replicas (a MultiDeviceIterator), twice in one process: fit returns
  well within the iterator's destruction (10 s; before, it returned after
  it), which happens on the one dropping thread, each run's in turn."""
  user_task.closed_at.clear()
  returned, threads = [], []
  for run in range(2):
    ended = _Ended()
    dist_keras.fit(user_task.model_fn, user_task.slow_closing_dataset_fn,
                   workdir=str(tmp_path / str(run)), strategy=mirrored,
                   callbacks=[ended], config={
                       "train.steps": 4, "train.global_batch_size": 48,
                       "eval.every": 4, "log.calibration_steps": 0,
                       "log.progress": False})
    returned.append(time.monotonic())
    # Loose: a loaded 2-core machine takes ~0.1 s here.
    assert returned[-1] - ended.at < user_task.CLOSE_SECONDS / 2
    threads.append([t.name for t in threading.enumerate()
                    ].count(_DROPPING_THREAD))
  deadline = time.monotonic() + 3 * user_task.CLOSE_SECONDS
  while len(user_task.closed_at) < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
  assert len(user_task.closed_at) == 2  # Each destroyed, after its fit.
  assert all(r < c for r, c in zip(returned, user_task.closed_at))
  assert threads == [1, 1]  # The second run's is the first's.


_FIT_AND_EXIT = """
import sys
import threading
sys.path.insert(0, {tests!r})
import dist_keras, user_task
user_task.CLOSE_SECONDS = 3.0
dist_keras.fit(user_task.model_fn, user_task.slow_closing_dataset_fn,
               workdir={workdir!r}, strategy="one_device", config={{
                   "train.steps": 2, "train.global_batch_size": 48,
                   "eval.every": 2, "log.calibration_steps": 0}})
user_task.closing.wait(60)  # The iterator's destruction under way: exit.
print("exiting", flush=True)
"""


def test_a_script_that_exits_while_its_iterator_is_destroyed_exits_0(
    tmp_path):
  """Python's exit waits out the destruction under way on the dropping
  thread (a daemon thread inside one as Python ends aborts the process:
  "terminate called ... exception not rethrown", exit -6)."""
  script = tmp_path / "fit_and_exit.py"
  script.write_text(_FIT_AND_EXIT.format(tests=helpers.TESTS,
                                         workdir=str(tmp_path / "run")))
  result = helpers.run_module([str(script)])
  assert result.returncode == 0, result.stderr[-2000:]
  assert "exiting" in result.stdout
  assert "terminate called" not in result.stderr
