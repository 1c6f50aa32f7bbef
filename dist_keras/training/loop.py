"""The distributed training loop: `strategy.run` steps in epochs, with one
list of actions at the step boundaries.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585), so dist_keras owns its loop: the same code runs on
one device, N local replicas, N workers and TPU cores. It reads like fit's:
epochs (one per eval interval) of calls of steps, the model's metrics reset
when an epoch begins, an eval when it ends, and everything else (logging,
profiling, calibration, the users' callbacks, stopping, checkpoints, the
reports to a Ray Train session (ray_report.py), preemption) as callbacks in
one keras.callbacks.CallbackList (actions.py).
"""
import contextlib
import dataclasses
import os

import keras
import tensorflow as tf

from dist_keras import errors, tensorboard_events, terminal
from dist_keras.distribute import iterators, strategies
from dist_keras.measure import flops, mfu, profiler
from dist_keras.measure.meters import RunMeters
from dist_keras.training import actions, allreduce, calls, divergence
from dist_keras.training import compiled, ending, evaluation, lr, metrics
from dist_keras.training import preemption, ray_report, report, run_files
from dist_keras.training import run_config, run_record, user_callbacks, watch
from dist_keras.training.checkpoints import Checkpoints
from dist_keras.training.settings import Settings, auto_steps_per_call


@dataclasses.dataclass
class Parts:
  """What the loop trains: built and checked by api.build."""
  role: strategies.Role  # The strategy; chief or not; how many workers.
  model: object  # keras.Model, compiled, its variables in the scope.
  train_ds: object  # Distributed datasets (distribute/pipelines.py).
  eval_ds: object
  checkpoints: Checkpoints
  rate: lr.Rate
  optimizers: dict  # {name: each one the model holds}: optimizers_of.
  stop: preemption.StopRequest  # SIGTERM/Ctrl-C's; close() ends it.
  kept: contextlib.ExitStack  # process_state.kept: close() puts it back.
  callbacks: list = dataclasses.field(default_factory=list)  # The users'.
  evaluates: bool = True  # An eval split with a loss (checks.evaluates).
  batch_spec: object = None  # The train batches' (for the FLOPs).
  model_file: str = run_files.MODEL_FILE  # Or WEIGHTS_FILE: model_file().


class Trainer:
  """One training run of `parts` into `workdir` (use it in a `with`)."""

  def __init__(self, parts: Parts, settings: Settings, workdir: str,
               config_dict: dict, notes=()):
    self.parts, self.settings, self.workdir = parts, settings, workdir
    self.strategy, self.model, self.stop = (parts.role.strategy,
                                            parts.model, parts.stop)
    self.replicas = self.strategy.num_replicas_in_sync
    self.workers, self.chief = parts.role.workers, parts.role.chief
    self.custom_step = compiled.overrides(self.model, "train_step")
    self.config_dict = config_dict
    self.notes = list(notes)  # Said when run() starts, after the header.
    self.tensorboard = tensorboard_events.Writer(workdir, self.chief and settings.tensorboard)
    self.metric_state = metrics.MetricState(self.model)
    self.train_metrics = metrics.TrainMetrics(self.metric_state)
    self.eval_pass = evaluation.make_eval_pass(
        self.strategy, self.model, settings.step_options["jit_compile"])
    self.history = self.run_state = None  # History, RunState: once run.
    self.call_watch = watch.CallWatch(settings.progress_seconds if (
        self.chief and settings.progress) else 0, self.say)

  def say(self, message: str) -> None:
    if self.chief and self.settings.progress:
      terminal.say(message)

  def close(self) -> None:
    """Closes the summaries, deletes a non-chief's scratch files, puts the
    process back, lets go of the workdir and the stop signals: each even
    where one before it failed, in the reverse of api.build's order (the
    handler last: a Ctrl-C meanwhile is still the run's, not an error
    halfway through the put-backs)."""
    with contextlib.ExitStack() as undo:  # (Runs its callbacks last first.)
      undo.push(self.stop)
      undo.callback(run_files.release, self.workdir)  # (The chief's alone.)
      undo.callback(self.parts.kept.close)
      for part in (self.parts.checkpoints, self.tensorboard, self.call_watch):
        undo.callback(part.close)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def run(self) -> dict:
    """Trains to train.steps (or until a callback stops training),
    evaluating at every epoch's end and checkpointing on the way, between
    the run's first and last lines; returns summary.json (a finished
    workdir's own, kept)."""
    tensorboard = self.settings.tensorboard
    # Built only where printed: each reads the workdir for event files.
    talk = self.chief and self.settings.progress
    if talk:
      self.say(report.header(self.strategy, self.workdir, tensorboard))
    summary = self._train()
    if talk:
      self.say(report.footer(summary, self.workdir, tensorboard))
    return summary

  def _train(self) -> dict:
    """run() between its first and last lines."""
    kept = ending.finished_before(self)
    if kept is not None:
      self.stop.ended = True  # Nothing is trained or written.
      return kept
    run = self._start()
    iterator = iter(self.parts.train_ds)
    call = self._step_functions()
    # From here a stop request is answered at a step boundary, with a
    # checkpoint of that step.
    self.stop.before_training = False
    with self._actions(run, iterator) as hooks:
      hooks.on_train_begin()
      logs = {}
      while not run.finishing:
        logs = self._epoch(run, hooks, call, iterator)
      if run.final_eval is None:  # Resumed where training had ended.
        run.final_eval = self.evaluate()
      ending.finalize(self, run, hooks, logs)
    iterators.hold(iterator)
    return ending.finish(self, run)

  def _epoch(self, run, hooks, call, iterator) -> dict:
    """One epoch: calls of steps to its end, then the eval; returns the
    epoch's logs (train values, and the eval's as val_NAME)."""
    schedule = run.schedule
    epoch = schedule.epoch_after(run.step)
    first, last = epoch * schedule.epoch_steps, schedule.epoch_end(epoch)
    self.train_metrics.start_epoch(first)  # Before the hook, as fit.
    hooks.on_epoch_begin(epoch)
    if line := call.trainable_changed(self.model):
      self.say(line)
    while run.step < last and not run.stopping:
      hooks.on_train_batch_begin(run.step - first)
      self._call(run, call, iterator)
      hooks.on_train_batch_end(run.step - first - 1, self._batch_logs(run))
    self.meters.pause()
    logs = self.train_values(run.step)
    run.final_eval = self.evaluate(hooks)
    logs.update({f"val_{k}": v for k, v in run.final_eval.items()
                 if k != "examples"})
    hooks.on_epoch_end(epoch, logs)
    self.meters.resume()
    return logs

  def _start(self) -> actions.RunState:
    """The run's notes, config, TensorBoard layout and meters."""
    checkpoints = self.parts.checkpoints
    changed = (run_config.record(self.workdir, self.config_dict,
                                 checkpoints.saved_at is not None)
               if self.chief else "")
    past = ending.past_steps_line(checkpoints.saved_at,
                                  self.settings.schedule.steps,
                                  bool(checkpoints.stopped.numpy()))
    kept = self.parts.rate.kept_line(self.parts.optimizers,
                                     f"ckpt-{checkpoints.saved_at}")
    for note in [*self.notes, changed, past, self.parts.rate.line, kept]:
      if note:
        self.say(note)
    self.tensorboard.start(checkpoints.saved_at or 0)
    self.tensorboard.config(self.config_dict, checkpoints.saved_at or 0)
    self.tensorboard.sync_layout()
    counted = flops.count(self.model, self.parts.batch_spec)
    utilisation = mfu.for_run(
        counted, self.strategy, self.settings.precision,
        self.settings.peak_tflops, self.workers, self.chief)
    if not counted.known:
      self.say(mfu.unknown_line(counted))
    dtype = self.settings.step_options["allreduce_dtype"]
    self.meters = RunMeters(
        self.settings.global_batch_size, self.replicas, utilisation,
        allreduce.gradient_bytes(self.model.trainable_variables, dtype))
    self.run_state = actions.RunState(
        self.settings.schedule, checkpoints.saved_at or 0,
        multi_worker=self.workers > 1,
        stopping=bool(checkpoints.stopped.numpy()),
        call_limit=auto_steps_per_call(None, self.workers > 1),
        retries_left=self.settings.divergence_retries)
    if self.settings.divergence_retries and checkpoints.saved_at is None:
      checkpoints.save(0)  # Something to go back to.
    return self.run_state

  @contextlib.contextmanager
  def _actions(self, run, iterator):
    """The CallbackList of one run (its order is the order of actions at a
    boundary), with the profiler around it (and the SIGTERM/Ctrl-C handler
    api.build installed)."""
    users = user_callbacks.for_worker(
        self.parts.callbacks, self.chief,
        os.path.join(self.parts.checkpoints.scratch or "", "callbacks"),
        self.parts.kept)
    batch_logs = user_callbacks.want_batch_logs(users)
    stop = self.stop
    with profiler.Profiler(self.settings.profile_steps, self.workdir,
                           self.chief) as prof:
      before = [actions.Progress(run, self, self.settings.progress_seconds),
                actions.LogWindow(run, self),
                actions.Profile(run, prof),
                actions.Calibrate(run, self, iterator, stop)]
      after = [ending.TimePeakAgain(run, self.meters, stop),
               run_record.Keep(run, self, users),
               actions.SaveCheckpoints(run, self.parts.checkpoints,
                                       self.meters),
               *ray_report.for_session(run, self.parts.checkpoints,
                                       self.chief, self.meters),
               actions.AnswerStopRequest(run, stop, self.parts.checkpoints)]
      if users:
        after.insert(0, actions.AgreeToStop(run, self.strategy, batch_logs))
      self.history = keras.callbacks.History()
      hooks = keras.callbacks.CallbackList(
          [*before, *user_callbacks.clocked(users, self.meters.in_callbacks),
           self.history, *after],
          model=self.model, verbose=0, epochs=run.schedule.epochs,
          steps=run.schedule.epoch_steps)
      self._batch_logs_wanted = batch_logs
      yield hooks

  def _batch_logs(self, run) -> dict:
    """The epoch's running values for batch hooks, when a callback reads
    them (a read of every metric: a collective under multi-worker)."""
    if not self._batch_logs_wanted:
      return {}
    return self.train_values(run.step)

  def train_values(self, step: int, window: bool = False) -> dict:
    """The train values up to `step` as fit reports them, of the epoch
    (or of the log window): the model's metrics, or a model's own
    train_step's last logs where they name other things
    (MetricState.results)."""
    logs = self.run_state.step_logs if self.run_state else {}
    if window:
      return self.train_metrics.window(step, logs)
    return self.train_metrics.epoch(step, logs)

  def _step_functions(self) -> calls.Calls:
    return calls.of_trainer(self)

  def _call(self, run, call, iterator) -> None:
    """One call of steps after run.step; checked before anything reads or
    saves its results."""
    schedule = run.schedule
    timed = schedule.timed(run.step + 1, call.first_timed(run.resumed_at))
    n = 1 if timed else schedule.call_size(run.step, run.call_limit)
    try:
      out = call(iterator, timed, n)
    except (tf.errors.OutOfRangeError, StopIteration) as e:
      raise calls.run_dry_error(self, run, n) from e
    ran = int(out.get("steps", 1))
    run.step, run.out = run.step + ran, out
    # As fit logs them: a vector (a value per class) stays an array.
    run.step_logs = {k: metrics.logged(v)
                     for k, v in out.get("logs", {}).items()}
    # Every step, before anything is saved: a non-finite update must never
    # reach a checkpoint.
    try:
      divergence.check(run, out, self.model.optimizer, self.parts.checkpoints)
    except errors.Diverged as e:
      if not run.retries_left:
        raise
      self.say(divergence.go_back(run, self.parts.checkpoints, str(e)))
      self.train_metrics.forget_window(self.parts.checkpoints.record.restored)
      return
    self.meters.ran(ran, out)

  def evaluate(self, hooks=None) -> dict:
    """One pass of the eval split, logged; the callbacks' test hooks around
    it (the pass is one call: one test batch hook)."""
    if not self.parts.evaluates:
      return {}
    hooks = hooks or keras.callbacks.CallbackList([], model=self.model)
    hooks.on_test_begin()
    hooks.on_test_batch_begin(0)
    with self.call_watch.call("evaluating"):
      result = evaluation.evaluate(self.eval_pass, self.metric_state,
                                   self.parts.eval_ds)
    batches, seconds, traced = (result.pop(k)
                                for k in ("steps", "seconds", "traced"))
    if traced and self.run_state:  # Start-up cost, as a step's trace is.
      self.run_state.tracing_seconds += seconds
    logs = {k: v for k, v in result.items() if k != "examples"}
    hooks.on_test_batch_end(max(batches - 1, 0), logs)
    hooks.on_test_end(logs)
    step = (self.run_state.step if self.run_state
            else self.parts.checkpoints.saved_at or 0)
    values = {f"eval/{name}": value for name, value in logs.items()}
    if self.settings.perplexity and "loss" in logs:
      values["eval/perplexity"] = report.perplexity(logs["loss"])
    self.tensorboard.scalars(step, values)
    self.say(report.eval_line(step, result, seconds, traced))
    return result
