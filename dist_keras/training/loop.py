"""The distributed training loop: `strategy.run` steps, eval, checkpoints.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585), so dist_keras owns its loop: the same code runs on
one device, N local replicas, N workers and TPU cores. The loop gets its
parts built (api.build assembles them: the compiled model in scope, the
distributed datasets, the restored checkpoints) and the settings it reads.
"""
import dataclasses
import os

import numpy as np
import tensorflow as tf

from dist_keras import errors
from dist_keras.distribute import strategy as strategy_lib
from dist_keras.errors import UserError
from dist_keras.measure import breakdown as breakdown_lib
from dist_keras.measure import calibration, mfu, profiler, timing
from dist_keras.summaries import Summaries
from dist_keras.training import allreduce, lr as lr_lib, preemption, report
from dist_keras.training import step as step_lib, workdir as workdir_lib
from dist_keras.training.checkpoints import Checkpoints
from dist_keras.training.settings import Settings, auto_steps_per_call


@dataclasses.dataclass
class Parts:
  """What the loop trains: built and checked by api.build."""
  strategy: tf.distribute.Strategy
  model: object  # keras.Model, compiled, its variables in the scope.
  train_ds: object  # Distributed datasets (distribute/input.py).
  eval_ds: object
  checkpoints: Checkpoints
  rate: lr_lib.Rate

  @property
  def optimizer(self):
    return self.model.optimizer


class Trainer:
  """One training run of `parts` into `workdir` (use it in a `with`)."""

  def __init__(self, parts: Parts, settings: Settings, workdir: str,
               config_dict: dict, notes=()):
    self.parts, self.settings, self.workdir = parts, settings, workdir
    self.strategy, self.model = parts.strategy, parts.model
    self.optimizer = parts.optimizer
    self.replicas = self.strategy.num_replicas_in_sync
    self.workers = strategy_lib.num_workers(self.strategy)
    self.chief = strategy_lib.is_chief(self.strategy)
    self.config_dict = config_dict
    self.notes = list(notes)  # Said when run() starts, after the header.
    self.gradient_bytes = allreduce.gradient_bytes(
        self.model.trainable_variables, settings.step_options[
            "allreduce_dtype"])
    self.skipped_steps = 0  # float16 loss scaling: overflowed, not applied.
    # Steps per call under train.steps_per_loop=0, from each log window.
    self.call_limit = auto_steps_per_call(None, self.workers > 1)
    self.largest_call = 1  # Steps; the calibration times calls that size.
    if self.chief:  # Every check has passed: the first write.
      workdir_lib.prepare(workdir)
    self.summaries = Summaries(workdir, self.chief and settings.tensorboard)

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def log(self, message: str) -> None:
    if self.chief and self.settings.progress:
      print(message, flush=True)

  def close(self) -> None:
    """Closes the summaries and deletes a non-chief's scratch checkpoints."""
    self.summaries.close()
    self.parts.checkpoints.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def run(self) -> dict:
    """Trains to train.steps, evaluating and checkpointing on the way;
    returns summary.json."""
    self._start()
    steps = self._step_functions()
    throughput = timing.Throughput(self.settings.global_batch_size)
    sync_log = breakdown_lib.SyncLog()
    iterator = iter(self.parts.train_ds)
    with profiler.Profiler(self.settings.profile_steps, self.workdir,
                           self.chief) as prof, \
        preemption.StopRequest(self.strategy, self.workers > 1,
                               self.settings.schedule.log_every) as stop:
      last = self._train_loop(steps, iterator, throughput, sync_log, prof,
                              stop)
    final_eval = self.evaluate()
    self.parts.checkpoints.save(self.step)
    calibrated = self._calibrate(iterator, throughput, sync_log)
    return self._finish(last, final_eval, throughput, sync_log, calibrated)

  def _start(self) -> None:
    """The run's notes, config and TensorBoard layout, before step 1."""
    for note in [*self.notes, self.parts.rate.line]:
      if note:
        self.log(note)
    if self.chief:
      workdir_lib.write_json(self.workdir, workdir_lib.CONFIG_JSON,
                             self.config_dict)
    self.summaries.config(self.config_dict)
    self.summaries.sync_layout()
    self.utilisation = mfu.for_run(
        self.model, self.strategy, self.settings.precision,
        self.settings.peak_tflops, self.workers, self.chief)
    if self.utilisation.flops.uncounted:
      self.log("FLOPs counted as 0 (layers not known): "
               + "; ".join(self.utilisation.flops.uncounted))
    self.read_metrics = step_lib.make_metrics_reader(self.model)
    self.eval_pass = step_lib.make_eval_pass(self.strategy, self.model)

  def _step_functions(self) -> dict:
    """The timed step and the plain steps: one per call, or (any
    steps_per_loop but 1) "many", which runs a call of one step too, so a
    run traces two functions either way."""
    options = self.settings.step_options
    steps = {True: step_lib.make_train_step(
        self.strategy, self.model, self.optimizer, timed=True, **options)}
    if self.settings.schedule.steps_per_loop == 1:
      steps[False] = step_lib.make_train_step(
          self.strategy, self.model, self.optimizer, **options)
    else:
      steps["many"] = step_lib.make_multi_step(
          self.strategy, self.model, self.optimizer, **options)
    return steps

  def _train_loop(self, steps, iterator, throughput, sync_log, prof, stop):
    schedule, last = self.settings.schedule, {"loss": None}
    window = timing.Window()
    # The step count is kept here, on the host: a read of the optimizer's
    # counter (a mirrored variable) took ~0.85 ms under MirroredStrategy, and
    # five reads a step were ~7% of the default LSTM's step (issue 17). It
    # is checked against the counter at every log line.
    step = self.step
    while step < schedule.steps:
      out = self._run_steps(steps, iterator, prof, step)
      ran = int(out.get("steps", 1))
      step += ran
      window.add(out["loss"].numpy(), ran)
      # Every step, before anything is saved: a non-finite update must never
      # reach a checkpoint.
      self._check_finite(step, out)
      if "stamps" in out and step > 1:  # Step 1 warmed the function up.
        window.breakdown = breakdown_lib.breakdown(
            out["step_start"].numpy(), out["inputs_ready"].numpy(),
            out["stamps"].numpy(), out["collective_waits"].numpy())
      # The compiled metrics hold this window's state: log them before an
      # eval pass resets them.
      if schedule.logs(step) or (schedule.evaluates(step) and window.steps):
        self._check_step(step)
        last = self._log_train(step, window, throughput, sync_log)
        window = timing.Window()
      window.pause()  # Checkpoints and eval are not train-step time.
      self._between_steps(step, stop)
      window.resume()
    return last

  def _between_steps(self, step: int, stop) -> None:
    """A preemption's checkpoint and exit, a checkpoint, an eval."""
    if stop.should_stop(step):
      path = self.parts.checkpoints.save(step)
      raise errors.Preempted(
          f"stopped by SIGTERM after step {step}; checkpoint "
          f"{os.path.basename(path)} saved in {self.parts.checkpoints.folder}"
          "; rerun the same command to resume from it.")
    if self.settings.schedule.checkpoints(step):
      self.parts.checkpoints.save(step)
    if self.settings.schedule.evaluates(step):
      self.evaluate()

  def _check_step(self, step: int) -> None:
    """The host's step count is the optimizer's (every step advances it by
    one, a loss-scaled skipped step included: step._count_skipped_step)."""
    if self.step != step:
      raise RuntimeError(f"the optimizer counted {self.step} steps where "
                         f"the loop ran {step}: a dist_keras bug.")

  def _run_steps(self, steps, iterator, prof, step: int) -> dict:
    """One call of a step function after `step`: a timed step, or up to
    steps_per_loop plain ones; a train stream that runs dry is the user's
    to fix."""
    schedule = self.settings.schedule
    timed = schedule.timed(step + 1)
    n = 1 if timed else schedule.call_size(step, self.call_limit)
    self.largest_call = max(self.largest_call, n)
    try:
      with prof.step(step + 1):
        if timed or "many" not in steps:
          return steps[timed](iterator)
        return steps["many"](iterator, tf.constant(n))
    except (tf.errors.OutOfRangeError, StopIteration) as e:
      # Which step of a call of n failed is not known here (the optimizer's
      # step counter may have counted the failed step: it does not wait for
      # the batch).
      at = f"step {step + 1}" if n == 1 else f"steps {step + 1}-{step + n}"
      raise UserError(
          f"dataset_fn('train', ...) ran out of batches at {at}; repeat it "
          f"(ds.repeat()) so training runs train.steps={schedule.steps} "
          "steps.") from e

  def _check_finite(self, step: int, out: dict) -> None:
    """Stops training at the first non-finite loss or gradient norm.

    Under float16 loss scaling an overflowing gradient is expected now and
    then: the update skipped it and halved the scale (counted in
    skipped_steps). Only a non-finite loss, or a scale driven below 1 (the
    gradients overflow even unscaled), is divergence there.
    """
    loss, norm = float(out["loss"].numpy()), float(out["grad_norm"].numpy())
    skipped = int(out["skipped"])
    self.skipped_steps += skipped
    scale = step_lib.loss_scale_of(self.optimizer)
    if skipped and np.isfinite(loss) and float(scale.numpy()) >= 1.0:
      return
    if np.isfinite(loss) and np.isfinite(norm):
      return
    latest = self.parts.checkpoints.latest()
    kept = (f"the last good checkpoint ({os.path.basename(latest)}) is kept"
            if latest else "no checkpoint was saved before it")
    raise errors.Diverged(
        f"loss {loss} and gradient norm {norm} at step {step}: training "
        f"diverged; {kept}. Lower the learning rate or clip the gradient "
        "norm (train.global_clipnorm, or the optimizer's global_clipnorm), "
        "then rerun to resume from it.")

  def _log_train(self, step, window, throughput, sync_log) -> dict:
    """Logs the window since the last line; returns its loss and metrics."""
    seconds = window.elapsed()
    self.call_limit = auto_steps_per_call(seconds / window.steps,
                                          self.workers > 1)
    loss = window.loss_sum / window.steps
    metrics = {name: float(value) for name, value in
               self.read_metrics().items()}
    self.model.reset_metrics()  # The next window starts from zero.
    values = {"loss": loss, **metrics, **self._extra_values(loss)}
    if throughput.add(window.steps, seconds):
      eps = self.settings.global_batch_size * window.steps / seconds
      values.update({"perf/step_ms": 1e3 * seconds / window.steps,
                     "perf/examples_per_sec": eps,
                     "perf/examples_per_sec_per_replica": eps / self.replicas,
                     **self.utilisation.scalars(eps)})
    if window.breakdown:
      values.update(sync_log.add(window.breakdown))
      values["sync/gradient_bytes"] = self.gradient_bytes
    self.summaries.scalars(step, values)
    schedule = self.settings.schedule
    remaining = (schedule.steps - step) * (throughput.step_seconds
                                           or seconds / window.steps)
    self.log(report.progress_line(step, schedule.steps,
                                  {"loss": loss, **metrics},
                                  values.get("perf/examples_per_sec"),
                                  remaining))
    return {"loss": loss, **metrics}

  def _extra_values(self, loss: float) -> dict:
    """The learning rate, perplexity and the float16 loss scale."""
    values = {"learning_rate": lr_lib.last_applied(self.optimizer)}
    if self.settings.perplexity:
      values["perplexity"] = report.perplexity(loss)
    scale = step_lib.loss_scale_of(self.optimizer)
    if scale is not None:
      values["train/loss_scale"] = float(scale.numpy())
      values["train/skipped_steps"] = self.skipped_steps
    return values

  def evaluate(self) -> dict:
    """One pass of the eval split, logged; resets the compiled metrics."""
    result = step_lib.evaluate(self.eval_pass, self.read_metrics, self.model,
                               self.parts.eval_ds)
    self.model.reset_metrics()
    values = {f"eval/{name}": value for name, value in result.items()
              if name != "examples"}
    if self.settings.perplexity:
      values["eval/perplexity"] = report.perplexity(result["loss"])
    self.summaries.scalars(self.step, values)
    self.log(report.eval_line(self.step, result))
    return result

  def _calibrate(self, iterator, throughput, sync_log) -> dict:
    """The no-communication baseline and the all-reduce model check."""
    steps = self.settings.calibration_steps
    if not steps or not throughput.step_seconds:
      return {}
    ideal_ms = calibration.no_communication_step_ms(
        self.strategy, step_lib.make_compute_only(self.model, self.optimizer),
        iterator, steps, per_call=self.largest_call)
    measured = sync_log.means().get("allreduce_ms")
    out = calibration.check(self.strategy, 1e3 * throughput.step_seconds,
                            ideal_ms, self.gradient_bytes, measured,
                            deterministic=self.workers > 1)
    for line in calibration.lines(out, self.gradient_bytes, measured,
                                  self.replicas > 1):
      self.log(line)
    return out

  def _finish(self, last, final_eval, throughput, sync_log, calibrated):
    eps = throughput.examples_per_sec
    if eps:
      self.log(timing.throughput_line(
          eps, timing.step_time_stats(throughput.window_ms)))
    summary = report.summary(
        run=self._run_fields(), last=last, final_eval=final_eval,
        throughput=throughput, sync_log=sync_log, calibrated=calibrated,
        utilisation=self.utilisation, gradient_bytes=self.gradient_bytes,
        skipped_steps=self.skipped_steps)
    self.log(self.utilisation.line(eps))
    self.summaries.flush()
    if self.chief:
      workdir_lib.save_model(self.workdir, self.model)
      workdir_lib.write_json(self.workdir, workdir_lib.SUMMARY_JSON, summary)
    return summary

  def _run_fields(self) -> dict:
    return {"strategy": strategy_lib.display_name(self.strategy),
            "device_kind": mfu.device_kind(self.strategy),
            "replicas": self.replicas, "steps": self.step,
            "global_batch_size": self.settings.global_batch_size,
            "dtype_policy": self.model.dtype_policy.name,
            "base_learning_rate": self.parts.rate.base,
            "peak_learning_rate": self.parts.rate.peak}
