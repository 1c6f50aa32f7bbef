"""Users' Keras callbacks, run as Keras' `fit` runs them.

The mapping (docs/own_models.md#callbacks): an epoch is one eval interval
(`eval.every` steps; the whole run when it is 0); epoch logs hold the
epoch's train loss and metrics and the eval's under `val_` names, as `fit`
names them; batch hooks run once per call of steps (one step, or many when
steps run many to a call, as under `fit`'s steps_per_execution), with the
epoch's running values. Under multi-worker training every worker runs every
callback on the same values; files go where the chief writes them, and to
a scratch folder on other workers (as Keras does for multi-worker).
"""
import os
import time

import keras

from dist_keras import validate
from dist_keras.contract import checks, imports
from dist_keras.errors import UserError
from dist_keras.training import compiled, keras_internals

# Attributes naming the files of Keras' file-writing callbacks
# (ModelCheckpoint, CSVLogger, TensorBoard).
_FILE_ATTRIBUTES = ("filepath", "filename", "log_dir")
# Keras' callbacks that set the optimizer's learning rate.
_SETS_THE_RATE = (keras.callbacks.ReduceLROnPlateau,
                  keras.callbacks.LearningRateScheduler)
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end",
                "on_batch_begin", "on_batch_end")


def collect(factory: str, given, model, train_cfg) -> tuple[list, str]:
  """The callbacks passed to fit (`given`), or those the callbacks factory
  train.callbacks (`factory`, PKG.MODULE:FN) returns, checked (against
  `model` too), and the line one_step_per_call says ("" if none)."""
  if factory and given is not None:
    raise UserError(
        f"callbacks were passed to fit and train.callbacks={factory!r} "
        "names more; pass them one way.")
  if factory:
    make = imports.load("train.callbacks", factory)
    checks.check_signature(make, "train.callbacks")
    given = make()
  callbacks = check(given)
  note = one_step_per_call(callbacks, train_cfg) or ""
  check_for_model(callbacks, model)
  return callbacks, note


def check(callbacks) -> list:
  """The users' callbacks as a list, checked.

  Raises:
    UserError: something that is not a keras.callbacks.Callback, or Keras'
      BackupAndRestore (dist_keras resumes by itself).
  """
  if callbacks is None:
    return []
  if isinstance(callbacks, keras.callbacks.Callback):
    callbacks = [callbacks]
  if isinstance(callbacks, (str, dict)) or not hasattr(callbacks,
                                                        "__iter__"):
    raise UserError(
        f"the callbacks are a {type(callbacks).__name__}, not a list of "
        "keras callbacks; pass (or have train.callbacks' function return) "
        "a list.")
  callbacks = list(callbacks)
  for i, callback in enumerate(callbacks):
    if isinstance(callback, keras.callbacks.BackupAndRestore):
      raise UserError(
          f"callbacks[{i}] is keras.callbacks.BackupAndRestore, but "
          "dist_keras already resumes from its own checkpoints (rerun with "
          f"the same {validate.workdir_option()}; train.checkpoint_every "
          "sets how often); "
          "remove it.")
    if not isinstance(callback, keras.callbacks.Callback):
      raise UserError(
          f"callbacks[{i}] is a {type(callback).__name__}, not a "
          "keras.callbacks.Callback; pass Keras callbacks (or subclasses).")
  return callbacks


def check_for_model(callbacks: list, model) -> None:
  """Raises UserError for a callback the model cannot serve, which Keras
  would find only at the first eval, an epoch into the run: a
  SwapEMAWeights without the optimizer's averages, a callback that sets
  the learning rate of a LearningRateSchedule (Keras raises a TypeError at
  its first change, an epoch or more into the run)."""
  if not callbacks:
    return
  optimizer = model.optimizer
  shown = type(keras_internals.inner(optimizer)).__name__
  keeps_ema = compiled.keeps_ema(optimizer)
  schedule = keras_internals.rate_schedule(optimizer)
  for i, callback in enumerate(callbacks):
    if (isinstance(callback, keras.callbacks.SwapEMAWeights)
        and not keeps_ema):
      raise UserError(
          f"callbacks[{i}] is keras.callbacks.SwapEMAWeights, but the "
          f"model's optimizer ({shown}) has use_ema="
          "False; compile with use_ema=True, or remove it.")
    if schedule is not None and isinstance(callback, _SETS_THE_RATE):
      raise UserError(
          f"callbacks[{i}] is keras.callbacks.{type(callback).__name__}, "
          "which sets the learning rate, but the model's optimizer ("
          f"{shown}) takes its rate from a "
          f"LearningRateSchedule ({type(schedule).__name__}), which Keras "
          "cannot set (fit fails at the callback's first change); compile "
          "the optimizer with a float learning_rate, or remove the callback.")


def for_worker(callbacks: list, chief: bool, scratch: str, kept) -> list:
  """On a worker that is not the chief, points every Keras file-writing
  callback into `scratch` (the chief writes the real files), until `kept`
  (process_state.kept) closes: the user's objects then write where they
  did, in Keras' fit after the run too."""
  if chief:
    return callbacks
  for callback in callbacks:
    for name in _FILE_ATTRIBUTES:
      path = getattr(callback, name, None)
      if isinstance(path, str) and path:
        folder = os.path.join(scratch, type(callback).__name__)
        os.makedirs(folder, exist_ok=True)  # CSVLogger makes none.
        setattr(callback, name, os.path.join(
            folder, os.path.basename(os.path.normpath(path))))
        kept.callback(setattr, callback, name, path)
  return callbacks


def one_step_per_call(callbacks: list, train_cfg) -> str | None:
  """With a callback that has batch hooks and calls sized by time
  (train.steps_per_loop=0, the model's steps_per_execution 1), one step a
  call, so that the hooks see every batch, as under fit; the line saying
  so."""
  if train_cfg.steps_per_loop or not want_batch_logs(callbacks):
    return None
  train_cfg.steps_per_loop = 1
  return ("steps per call: 1 (a callback has batch hooks, which fit runs "
          "every step at steps_per_execution=1; set train.steps_per_loop=K "
          "or compile with steps_per_execution=K to run them every K)")


def want_batch_logs(callbacks: list) -> bool:
  """Whether a callback reads batch logs (then every call's end reads the
  metrics: a collective under multi-worker). Keras' ModelCheckpoint and
  TensorBoard have batch hooks but read nothing there when they act per
  epoch."""
  return any(_reads_batch_logs(c) for c in callbacks)


def _reads_batch_logs(callback) -> bool:
  if isinstance(callback, keras.callbacks.ModelCheckpoint):
    return callback.save_freq != "epoch"
  if isinstance(callback, keras.callbacks.TensorBoard):
    return callback.update_freq != "epoch"
  if isinstance(callback, keras.callbacks.History):
    return False
  return any(_overrides(callback, hook) for hook in _BATCH_HOOKS)


def _overrides(callback, hook: str) -> bool:
  """Whether `callback` has its own `hook` (a subclass's method, or an
  attribute such as LambdaCallback sets)."""
  method = getattr(callback, hook)
  return getattr(method, "__func__", method) is not getattr(
      keras.callbacks.Callback, hook)


def clocked(callbacks: list, count) -> list:
  """`callbacks` between two clock marks that hand `count` the seconds the
  hooks between them took, at the hooks that run inside a log window
  (batch begin and end, epoch begin: an epoch's end is paused out): what
  sync/callbacks_ms reports."""
  if not callbacks:
    return []
  began = [0.0]
  return [_Mark(began, None), *callbacks, _Mark(began, count)]


class _Mark(keras.callbacks.Callback):
  """Where the users' callbacks begin (`count` None) or end."""

  def __init__(self, began: list, count):
    super().__init__()
    self.began, self.count = began, count

  def _mark(self, *args, **kwargs):
    del args, kwargs
    now = time.perf_counter()
    if self.count is None:
      self.began[0] = now
    else:
      self.count(now - self.began[0])

  on_train_batch_begin = on_train_batch_end = on_epoch_begin = _mark
