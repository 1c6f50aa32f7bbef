"""What one `dist_keras.fit` leaves behind for a notebook's next cell: the
process as the run found it, as after Keras' own fit
(training/process_state.py): the global random generators, the returned
model's optimizer, the root logger; and no retracing warning from a
process's fifth fit."""
import logging
import random
import signal
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import user_task
from dist_keras.training import keras_internals, process_state, run_files


def _draws():
  """One number of each global generator a user's random search draws
  from: Python's, NumPy's, TensorFlow's and Keras' (no seed of their own)."""
  return (random.random(), float(np.random.random()),
          float(tf.random.uniform(())), float(keras.random.uniform(())))


@pytest.fixture(name="fitted", scope="module")
def _fitted(mirrored, tmp_path_factory):
  """One fit of a user's model in a process whose root logger has no
  handler (a notebook's: pytest's own are set aside meanwhile), between
  two draws of generators the user seeded; what the second draw would be
  without the fit."""
  keras.utils.set_random_seed(1)
  _draws()
  undisturbed = _draws()
  keras.utils.set_random_seed(1)
  _draws()
  root = logging.getLogger()
  handlers, root.handlers = root.handlers, []
  try:
    result = dist_keras.fit(
        user_task.model_fn, user_task.dataset_fn,
        workdir=str(tmp_path_factory.mktemp("run")), strategy=mirrored,
        config={"train.steps": 4, "eval.every": 2,
                "train.checkpoint_every": 2, "train.global_batch_size": 48,
                "log.calibration_steps": 0})
    root_handlers = list(root.handlers)
  finally:
    root.handlers = handlers
  return types.SimpleNamespace(draws=_draws(), undisturbed=undisturbed,
                               root_handlers=root_handlers, result=result)


def test_the_global_generators_go_on_as_if_no_fit_had_drawn(fitted):
  """fit seeds them with runtime.seed for its run (its weights and data
  order are the same on every rerun) and left them so: a notebook's
  random search drew the same values after every fit."""
  assert fitted.draws == fitted.undisturbed


def test_the_returned_optimizer_all_reduces_again_under_keras_fit(
    fitted, mirrored):
  """The run's all-reduce routing stayed on the returned model's
  optimizer: Keras' fit of it under the same strategy skipped the
  all-reduce, and the replicas' copies drifted apart without a word."""
  model = fitted.result.model
  model.fit(user_task.dataset_fn("train", tf.distribute.InputContext()),
            steps_per_epoch=4, epochs=1, shuffle=False, verbose=0)
  for variable in model.trainable_variables:
    first, *others = (np.asarray(copy) for copy in
                      mirrored.experimental_local_results(variable.value))
    for other in others:
      np.testing.assert_array_equal(first, other, err_msg=variable.path)
  assert not set(vars(model.optimizer)) & {
      keras_internals.ALLREDUCE_HOOK, "apply", "_backend_apply_gradients"}


def test_the_root_logger_keeps_no_handler(fitted):
  """TensorFlow's checkpoint writer logs through absl, which called
  logging.basicConfig() on the handler-less root: every TensorFlow warning
  then printed twice, and the user's own basicConfig(...) did nothing."""
  assert not fitted.root_handlers


def test_records_no_handler_takes_still_reach_the_last_resort(monkeypatch):
  """Meanwhile, a warning of a logger without handlers is printed as
  Python prints it with none on the root (logging.lastResort); one a
  handler took is not printed again; absl adds no handler."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  root, last = logging.getLogger(), []
  monkeypatch.setattr(root, "handlers", [])
  monkeypatch.setattr(logging, "lastResort", types.SimpleNamespace(
      level=logging.WARNING, handle=last.append))
  handled = logging.getLogger("dist_keras_test.handled")
  monkeypatch.setattr(handled, "handlers", [logging.NullHandler()])
  with process_state.root_logger_kept():
    absl_logging.info("as TensorFlow's checkpoint writer logs")
    logging.getLogger("dist_keras_test.mine").warning("the user's warning")
    logging.getLogger("dist_keras_test.mine").info("below the last resort")
    handled.warning("taken by its handler")
  assert [record.getMessage() for record in last] == ["the user's warning"]
  assert not root.handlers


def test_fits_in_one_process_are_not_warned_of_retracing(monkeypatch,
                                                         tmp_path):
  """TensorFlow counts a tf.function's traces by its Python code, not by
  the function: from a process's fourth or fifth fit it warned that
  dist_keras' step function "triggered tf.function retracing ... define
  your @tf.function outside of the loop" (keras_internals.made_per_run).
  The count starts here (earlier tests' fits are not this one's)."""
  from tensorflow.python.eager.polymorphic_function import polymorphic_function  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(
      polymorphic_function, "_frequent_tracing_detector_manager",
      polymorphic_function._FrequentTracingDetectorManager())  # pylint: disable=protected-access
  with helpers.logged() as warned:
    for i in range(5):
      helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                      tmp_path / str(i), {
                          "train.steps": 3, "eval.every": 0,
                          "train.global_batch_size": 48,
                          "log.calibration_steps": 0})
  assert not [line[:120] for line in warned if "retracing" in line]


@pytest.mark.parametrize("broken", ["tensorboard", "release"])
def test_a_put_back_that_fails_does_not_skip_the_others(
    broken, mirrored, tmp_path, monkeypatch):
  """The Trainer's close lets go of each thing the run took even where one
  before it fails (a summary writer's last flush on a full disk, a
  workdir's lock): a failed release left the run's SIGTERM and Ctrl-C
  handler on (a notebook's Ctrl-C then did nothing) and the global
  generators seeded; a failed writer left a worker's scratch files."""
  before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  random.seed(7)
  expected = random.random()
  random.seed(7)
  trainer = helpers.trainer(helpers.tiny_config(), tmp_path, mirrored)
  closed = []
  real_close = trainer.parts.checkpoints.close
  monkeypatch.setattr(trainer.parts.checkpoints, "close",
                      lambda: closed.append(real_close()))

  def fail(*args, **kwargs):
    raise OSError("no space left on device")

  real_release = run_files.release
  if broken == "release":
    monkeypatch.setattr(run_files, "release", fail)
  else:
    monkeypatch.setattr(trainer.tensorboard, "close", fail)
  try:
    with pytest.raises(OSError, match="no space left"):
      trainer.close()
  finally:
    real_release(str(tmp_path))  # (Nothing, where the close let go of it.)
  assert {s: signal.getsignal(s) for s in before} == before
  assert random.random() == expected
  assert closed
