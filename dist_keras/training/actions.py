"""What happens at a step boundary, as Keras callbacks: the built-in actions
run in one keras.callbacks.CallbackList with the users' callbacks, in order
(Trainer._actions in loop.py): say how the run is going between log
lines, log the window, profile, calibrate, the
users' callbacks, History, agree to stop, checkpoint, report to Ray Train
(ray_report.py, only inside its session), answer a SIGTERM or Ctrl-C. A
boundary that ends an epoch is an epoch end (after the eval); any other is a
batch end.
"""
import dataclasses
import time

import keras

from dist_keras.distribute import leaving
from dist_keras.measure import calibration, timing
from dist_keras.training import allreduce, lr, preemption, report
from dist_keras.training import rnn_states, steps
from dist_keras.training.settings import Schedule, auto_steps_per_call


@dataclasses.dataclass
class RunState:
  """The loop's state between calls, which the actions read and update."""
  schedule: Schedule
  step: int  # Steps done: batches read (the host's count, checkpointed).
  multi_worker: bool = False
  out: dict = dataclasses.field(default_factory=dict)  # The last call's.
  step_logs: dict = dataclasses.field(default_factory=dict)  # Its logs.
  stopping: bool = False  # Every worker agreed: model.stop_training.
  call_limit: int = 1  # Steps per call under train.steps_per_loop=0.
  skipped_steps: int = 0  # float16 loss scaling: overflowed, not applied.
  logged: dict = dataclasses.field(default_factory=dict)  # Last window's.
  logged_at: int = -1  # The step that window ended at.
  perf: dict = dataclasses.field(default_factory=dict)  # Its perf/, sync/.
  retries_left: int = 0  # train.divergence_retries not yet used.
  skipped: list = dataclasses.field(default_factory=list)  # [first, last].
  final_eval: dict | None = None
  tracing_seconds: float = 0.0  # Of the calls that traced a function.
  calibrated: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.resumed_at = self.step  # Its checkpoint's step (0: none).

  @property
  def finishing(self) -> bool:
    return self.stopping or self.step >= self.schedule.steps


class Boundary(keras.callbacks.Callback):
  """An action at every step boundary: `at(step, epoch_end)` once per
  boundary, from the batch end, or from the epoch end when the step ends
  an epoch (then after the eval and the users' epoch-end hooks)."""

  def __init__(self, run: RunState):
    super().__init__()
    self.run = run

  def on_train_batch_end(self, batch, logs=None):
    if not self.run.schedule.ends_epoch(self.run.step) and not (
        self.run.stopping):
      self.at(self.run.step, epoch_end=False)

  def on_epoch_end(self, epoch, logs=None):
    self.at(self.run.step, epoch_end=True)

  def at(self, step: int, epoch_end: bool) -> None:
    raise NotImplementedError


class Progress(keras.callbacks.Callback):
  """The lines between log lines: a call that traced and compiled a step
  function (the first call, and the first plain one where plain steps run
  a function of their own: seconds to minutes for a large model, or under
  XLA), and a heartbeat whenever
  `every_seconds` pass without a line, as train.log_every steps of a slow
  model can take minutes. Only the host's clock and step count are read:
  no collective."""

  def __init__(self, run: RunState, trainer, every_seconds: float):
    super().__init__()
    self.run, self.trainer, self.every = run, trainer, every_seconds
    self._call = (0.0, 0)  # (clock, step) when the current call began.
    self._since = None  # (clock, step) after the last tracing call.
    self._last_line = time.monotonic()

  def on_train_batch_begin(self, batch, logs=None):
    self._call = (time.monotonic(), self.run.step)

  def on_train_batch_end(self, batch, logs=None):
    now, step, schedule = time.monotonic(), self.run.step, self.run.schedule
    traced = self.run.out.get("traced")
    if traced:
      seconds = now - self._call[0]
      self.run.tracing_seconds += seconds
      self._since, self._last_line = (now, step), now
      self.trainer.say(report.traced_line(self._call[1] + 1, step, seconds,
                                          traced))
    elif schedule.says_progress(step):
      self._last_line = now  # LogWindow says one.
    elif self.every and now - self._last_line >= self.every:
      self._last_line = now
      since, from_step = self._since or self._call
      per_step = (now - since) / (step - from_step) if (
          step > from_step) else None
      self.trainer.say(report.heartbeat_line(step, schedule.steps, per_step))

  def on_epoch_end(self, epoch, logs=None):
    self._last_line = time.monotonic()  # After the eval's line.


class LogWindow(keras.callbacks.Callback):
  """At every log step and epoch end: the window's train values and
  measurements to TensorBoard, and a progress line; a window that a stop
  cut short closes before the eval (summary.json's train values are the
  last steps', not the window before)."""

  def __init__(self, run: RunState, trainer):
    super().__init__()
    self.run, self.trainer = run, trainer
    self._logged_at = run.step

  def on_train_batch_end(self, batch, logs=None):
    if self.run.schedule.says_progress(self.run.step):
      self._log(self.run.step)

  def on_test_begin(self, logs=None):
    if self.run.step > self._logged_at:
      self._log(self.run.step)

  def on_epoch_end(self, epoch, logs=None):  # (A model without eval.)
    self.on_test_begin()

  def _log(self, step: int) -> None:
    self._logged_at = step
    schedule = self.run.schedule
    train = self.trainer.train_values(step, window=True)
    perf, seconds = self.trainer.meters.close_window()
    if seconds is None:  # Nothing ran since the last line.
      return
    self.run.call_limit = auto_steps_per_call(seconds, self.run.multi_worker)
    self.run.logged, self.run.perf = train, perf
    self.run.logged_at = step
    self.trainer.tensorboard.scalars(step, {**train, **self._extra(train),
                                          **perf})
    self.trainer.say(report.progress_line(
        step, schedule.steps, train, perf.get("perf/examples_per_sec"),
        self.trainer.meters.seconds_left(schedule.steps - step, seconds)))

  def _extra(self, train: dict) -> dict:
    """The learning rate, perplexity and the float16 loss scale."""
    optimizer = self.model.optimizer
    values = lr.logged_rates(self.trainer.parts.optimizers)
    if self.trainer.settings.perplexity and "loss" in train:
      values["perplexity"] = report.perplexity(train["loss"])
    scale = steps.loss_scale_of(optimizer)
    if scale is not None:
      values["train/loss_scale"] = float(scale.numpy())
      values["train/skipped_steps"] = self.run.skipped_steps
    return values


class Profile(keras.callbacks.Callback):
  """log.profile_steps: traces the chosen steps, each marked."""

  def __init__(self, run: RunState, profiler):
    super().__init__()
    self.run, self.profiler, self._trace = run, profiler, None

  def on_train_batch_begin(self, batch, logs=None):
    self._trace = self.profiler.step(self.run.step + 1)
    self._trace.__enter__()

  def on_train_batch_end(self, batch, logs=None):
    if self._trace is not None:
      self._trace.__exit__(None, None, None)
      self._trace = None


class Calibrate(keras.callbacks.Callback):
  """After training: the free-communication step and the all-reduce model
  (log.calibration_steps; not for a model's own train_step). Skipped when a
  stop was requested: before it begins (agreed by every worker), or, on one
  host, while it runs."""

  def __init__(self, run: RunState, trainer, iterator, stop_request):
    super().__init__()
    self.run, self.trainer, self.iterator = run, trainer, iterator
    self.stop_request = stop_request

  def on_train_end(self, logs=None):
    trainer, meters = self.trainer, self.trainer.meters
    count, largest = trainer.settings.calibration_steps, meters.calls.largest()
    if not count or not largest or trainer.custom_step:
      return
    if self.stop_request.agreed() or not self._calibrated(count, *largest):
      trainer.say(f"calibration skipped: {self.stop_request.describe()}")

  def _calibrated(self, count: int, size: int, step_seconds: float) -> bool:
    """Announces a long calibration, runs it and prints its results; False
    if a stop request cut it short. The run's step as the ideal one is
    timed: in calls of the same `size`, without what runs between calls (a
    callback's seconds are not communication): meters.calls.largest()."""
    trainer, meters = self.trainer, self.trainer.meters
    per_call, timed_calls = calibration.call_plan(count, size)
    seconds = per_call * (timed_calls + 1) * step_seconds
    if seconds >= trainer.settings.progress_seconds > 0:
      trainer.say(f"calibrating for about {timing.eta(seconds)}: {count} "
                  "steps without communication, then all-reduces "
                  "(log.calibration_steps=0 skips it)")
    try:
      with self.stop_request.skippable():
        measured = self._calibrate(count, size, step_seconds)
    except preemption.Skipped:
      return False
    for line in calibration.lines(self.run.calibrated, meters.traffic,
                                  measured, trainer.replicas > 1):
      trainer.say(line)
    return True

  def _calibrate(self, count: int, size: int, step_seconds: float):
    """Sets run.calibrated; returns the run's measured all-reduce ms."""
    trainer, meters = self.trainer, self.trainer.meters
    with calibration.model_kept(trainer.strategy, self.model,
                                also=rnn_states.variables(self.model)):
      ideal_ms = calibration.no_communication_step_ms(
          trainer.strategy, steps.make_compute_only(
              self.model, trainer.settings.step_options["allreduce_dtype"]),
          self.iterator, count, per_call=size)
    measured = meters.sync_log.means().get("allreduce_ms")
    self.run.calibrated = calibration.check(
        trainer.strategy, 1e3 * step_seconds, ideal_ms,
        meters.traffic, measured, deterministic=self.run.multi_worker)
    return measured


class AgreeToStop(Boundary):
  """Every worker stops at the same step when a callback sets
  `model.stop_training` (EarlyStopping, TerminateOnNaN, your own): one
  tiny all-reduce per epoch end (and per call when a callback has batch
  hooks) under multi-worker training."""

  def __init__(self, run: RunState, strategy, at_batch_ends: bool):
    super().__init__(run)
    self.at_batch_ends = at_batch_ends
    self._agree = (allreduce.any_worker(strategy) if run.multi_worker
                   else None)

  def at(self, step: int, epoch_end: bool) -> None:
    if not (epoch_end or self.at_batch_ends):
      return
    wanted = bool(getattr(self.model, "stop_training", False))
    if self._agree is not None:
      wanted = self._agree(wanted)
    self.run.stopping = wanted
    self.model.stop_training = wanted


class SaveCheckpoints(Boundary):
  """Every train.checkpoint_every steps, and where training ends."""

  def __init__(self, run: RunState, checkpoints, meters):
    super().__init__(run)
    self.checkpoints, self.meters = checkpoints, meters

  def at(self, step: int, epoch_end: bool) -> None:
    if self.run.schedule.checkpoints(step) or (
        epoch_end and self.run.finishing):
      self.meters.pause()
      self.checkpoints.save(step, stopped=self.run.stopping)
      self.meters.resume()


class AnswerStopRequest(Boundary):
  """A SIGTERM (preemption) or a Ctrl-C: checkpoint this step and exit,
  retryable (Preempted, or Interrupted for the Ctrl-C); a cluster's
  workers meet first, briefly."""

  def __init__(self, run: RunState, stop_request, checkpoints):
    super().__init__(run)
    self.stop_request, self.checkpoints = stop_request, checkpoints

  def on_train_begin(self, logs=None):
    self.stop_request.training_done = self.run.finishing  # A rerun at the end.

  def at(self, step: int, epoch_end: bool) -> None:
    if self.run.finishing:  # Its checkpoint is saved: nothing left to stop.
      self.stop_request.training_done = True
      return
    if not self.stop_request.should_stop(step):
      return
    if self.checkpoints.saved_at != step:
      self.checkpoints.save(step, stopped=self.run.stopping)
    if self.run.multi_worker:  # They agreed in a collective: see leaving.py.
      leaving.met_to_stop()
    raise self.stop_request.error(step, self.checkpoints.last_saved())
