"""The distributed training loop: `strategy.run` steps, eval, checkpoints.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585), so dist_keras owns its loop: the same code runs on
one device, N local replicas, N workers and TPU cores.
"""
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

from dist_keras import calibration
from dist_keras import lr as lr_lib
from dist_keras import preemption
from dist_keras import data as data_lib
from dist_keras import mfu as mfu_lib
from dist_keras import models, step as step_lib, sync, workdir as workdir_lib
from dist_keras import strategy as strategy_lib
from dist_keras import errors
from dist_keras.errors import UserError
from dist_keras.summaries import Summaries

OPTIMIZERS = {
    "sgd": keras.optimizers.SGD,
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "rmsprop": keras.optimizers.RMSprop,
}

# The optimizers train.momentum applies to (Adam-style optimizers have their
# own first-moment decay, beta_1, instead).
MOMENTUM_OPTIMIZERS = ("sgd", "rmsprop")

# Iterating a distributed dataset inside tf.function reads its options in
# graph mode, which warns on every eval trace; the behaviour is intended.
warnings.filterwarnings(
    "ignore", message="To make it possible to preserve tf.data options")


def check_optimizer(train_cfg) -> None:
  """Raises UserError for an unknown optimizer, a non-positive rate, a
  momentum it cannot use or a bad batch-size rule (lr.check)."""
  errors.check_choice("train.optimizer", train_cfg.optimizer, OPTIMIZERS)
  if not train_cfg.learning_rate > 0:
    raise UserError(f"train.learning_rate={train_cfg.learning_rate} must be "
                    "> 0.")
  if not 0.0 <= train_cfg.momentum < 1.0:
    raise UserError(f"train.momentum={train_cfg.momentum} must be in [0, 1) "
                    "(0.9 is the usual SGD momentum).")
  if train_cfg.momentum and train_cfg.optimizer not in MOMENTUM_OPTIMIZERS:
    raise UserError(f"train.momentum={train_cfg.momentum} does nothing with "
                    f"train.optimizer={train_cfg.optimizer!r} (its beta_1 "
                    "plays that part); use it with "
                    f"{' or '.join(MOMENTUM_OPTIMIZERS)}, or set momentum=0.")
  lr_lib.check(train_cfg)


def make_optimizer(train_cfg) -> keras.optimizers.Optimizer:
  """The optimizer `train_cfg.optimizer` names, at `train_cfg.learning_rate`
  scaled for the global batch and warmed up as train.lr_scaling and
  train.warmup_steps say (dist_keras.lr)."""
  check_optimizer(train_cfg)
  kwargs = {"learning_rate": lr_lib.learning_rate(train_cfg)}
  if train_cfg.optimizer in MOMENTUM_OPTIMIZERS:
    kwargs["momentum"] = train_cfg.momentum
  return OPTIMIZERS[train_cfg.optimizer](**kwargs)


def validate(config):
  """Every check of `config` that needs no strategy; returns its InputSpec.

  Creates no TensorFlow state, so it may run before the strategy splits the
  CPU into logical devices.
  """
  _check_train_cfg(config.train, config.eval)
  spec = data_lib.input_spec(config.data, models.inputs(config.model))
  models.check(config.model, spec)
  parse_profile_steps(config.log.profile_steps)
  check_optimizer(config.train)
  check_precision(config.train)
  errors.check_choice("runtime.allreduce_dtype",
                      config.runtime.allreduce_dtype, sync.ALLREDUCE_DTYPES)
  strategy_lib.communication_options(config.runtime)  # Its checks.
  mfu_lib.check(config.log)
  return spec


PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16",
              "float16": "mixed_float16"}


def check_precision(train_cfg) -> None:
  errors.check_choice("train.precision", train_cfg.precision, PRECISIONS)


def build_in_scope(strategy, config, spec):
  """Model and optimizer with every variable created in `strategy.scope()`.

  With train.precision=bfloat16 or float16 the layers compute in 16 bits and
  keep float32 variables (Keras' mixed precision), so gradients, their
  all-reduce and the update stay float32. bfloat16 has float32's range;
  float16 does not, so its optimizer is wrapped in a LossScaleOptimizer
  (dynamic loss scale). The policy is set only while the model is built:
  layers keep it, and nothing else in the process inherits it.
  """
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(PRECISIONS[config.train.precision])
  try:
    with strategy.scope():
      model = models.build(config.model, spec)
  finally:
    keras.config.set_dtype_policy(previous)
  with strategy.scope():
    optimizer = make_optimizer(config.train)
    if config.train.precision == "float16":
      optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    # Slots must exist before tracing: creating them inside a replica
    # function is not allowed under a strategy.
    optimizer.build(model.trainable_variables)
  sync.disable_optimizer_allreduce(optimizer)
  return model, optimizer


def is_chief(strategy) -> bool:
  """Whether this process writes summaries, checkpoints and files."""
  try:
    return bool(strategy.extended.should_checkpoint)
  except (AttributeError, NotImplementedError):
    return True


def num_workers(strategy) -> int:
  """Processes taking part in the strategy's collectives (1 if local)."""
  resolver = strategy.cluster_resolver  # None for single-host strategies.
  if resolver is None:
    return 1
  spec = resolver.cluster_spec()
  return max(1, sum(spec.num_tasks(job) for job in ("chief", "worker")
                    if job in spec.jobs))


@dataclasses.dataclass
class Throughput:
  """Wall-clock step timing that leaves out the first (tracing) interval."""
  examples_per_step: int
  seconds: float = 0.0
  steps: int = 0
  warmup_done: bool = False
  # Wall ms per step of each counted interval (log window), for the jitter.
  window_ms: list = dataclasses.field(default_factory=list)

  def add(self, steps: int, seconds: float) -> bool:
    """Counts an interval; returns False for the warm-up one (not counted)."""
    if not self.warmup_done:
      self.warmup_done = True
      return False
    self.seconds += seconds
    self.steps += steps
    self.window_ms.append(1e3 * seconds / steps)
    return True

  @property
  def step_seconds(self) -> float | None:
    return self.seconds / self.steps if self.steps else None

  @property
  def examples_per_sec(self) -> float | None:
    return self.examples_per_step / self.step_seconds if self.steps else None


def step_time_stats(window_ms) -> dict:
  """Median and 90th percentile of the log windows' wall ms per step, and
  their jitter: std / mean in % (None below 2 windows; all None for none)."""
  if not len(window_ms):
    return {"step_ms_median": None, "step_ms_p90": None,
            "step_ms_jitter": None}
  ms = np.asarray(window_ms, np.float64)
  return {"step_ms_median": float(np.median(ms)),
          "step_ms_p90": float(np.percentile(ms, 90)),
          "step_ms_jitter": (float(100 * ms.std() / ms.mean())
                             if len(ms) > 1 else None)}


def throughput_line(examples_per_sec: float, stats: dict) -> str:
  """'throughput 1,234 ex/s (step 12.3 ms median, p90 13.0 ms, jitter 2.1%)'."""
  jitter = stats["step_ms_jitter"]
  return (f"throughput {examples_per_sec:,.0f} ex/s (step "
          f"{stats['step_ms_median']:.1f} ms median, p90 "
          f"{stats['step_ms_p90']:.1f} ms, jitter "
          + (f"{jitter:.1f}%)" if jitter is not None else "n/a: one window)"))


def _eta(seconds: float | None) -> str:
  if seconds is None:
    return "--:--"
  minutes, secs = divmod(int(seconds), 60)
  return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _check_train_cfg(train_cfg, eval_cfg):
  for key in ("steps", "global_batch_size", "log_every", "checkpoint_every",
              "steps_per_loop"):
    if getattr(train_cfg, key) < 1:
      raise UserError(f"train.{key}={getattr(train_cfg, key)} must be >= 1.")
  for key in ("every", "steps"):
    if getattr(eval_cfg, key) < 0:
      raise UserError(f"eval.{key}={getattr(eval_cfg, key)} must be >= 0.")


class Trainer:
  """One training run of `config` into `workdir` under `strategy`."""

  def __init__(self, config, workdir: str, strategy):
    # Validate everything before anything is written.
    spec = validate(config)
    self.config, self.workdir, self.strategy = config, workdir, strategy
    self.replicas = strategy.num_replicas_in_sync
    self.chief = is_chief(strategy)
    # tf.timestamp has no TPU kernel: on a TPU the step breakdown and the
    # calibration (which times steps the same way) are off, said once.
    on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
    self.sync_timing = config.log.sync_timing and not on_tpu
    self.calibration_steps = 0 if on_tpu else config.log.calibration_steps
    if on_tpu and (config.log.sync_timing or config.log.calibration_steps):
      self.log("TPU: log.sync_timing and log.calibration_steps are off "
               "(tf.timestamp has no TPU kernel)")
    if config.data.name == data_lib.SYNTHETIC:
      self.log(data_lib.constant_batch.NOTE)
    data_lib.per_replica_batch_size(config.train.global_batch_size,
                                    self.replicas)
    if self.chief:
      workdir_lib.prepare(workdir)
    keras.utils.set_random_seed(config.runtime.seed)
    self.spec = spec
    self.model, self.optimizer = build_in_scope(strategy, config, spec)
    self.gradient_bytes = sync.gradient_bytes(
        self.model.trainable_variables, config.runtime.allreduce_dtype)
    self.skipped_steps = 0  # float16 loss scaling: overflowed, not applied.
    self.checkpoint = tf.train.Checkpoint(model=self.model,
                                          optimizer=self.optimizer)
    self.checkpoint_dir = os.path.join(workdir, workdir_lib.CHECKPOINTS)
    # Every worker takes part in a save (TF's multi-worker pattern), but only
    # the chief's lands in the workdir; the others write to a private
    # temporary folder, deleted by close().
    self._scratch = None if self.chief else tempfile.mkdtemp(
        prefix="dist_keras_worker_")
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._scratch or self.checkpoint_dir,
        max_to_keep=1 if self._scratch else config.train.max_checkpoints)
    # Restore before writing anything: a refused workdir stays untouched.
    self.restore()
    self.summaries = Summaries(workdir, self.chief and config.log.tensorboard)

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def log(self, message: str) -> None:
    if self.chief and self.config.log.progress:
      print(message, flush=True)

  def close(self) -> None:
    """Closes the summaries and deletes a non-chief's scratch checkpoints."""
    self.summaries.close()
    if self._scratch:
      shutil.rmtree(self._scratch, ignore_errors=True)

  def restore(self) -> int:
    """Restores the latest checkpoint, if any; returns the step reached.

    Every worker reads the CHIEF's checkpoint folder, so a multi-worker
    resume needs a workdir all workers see (shared disk or gs://).
    """
    latest = tf.train.latest_checkpoint(self.checkpoint_dir)
    if latest:
      try:
        self.checkpoint.restore(latest).assert_existing_objects_matched()
      except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise UserError(
            f"--workdir={self.workdir} holds a checkpoint ({latest}) made by "
            "a different model or optimizer; resume it with the config.json "
            "saved there, or pass a new --workdir.") from e
      self.log(f"resumed from {latest} at step {self.step}")
    self._check_workers_agree_on_step()
    return self.step

  def _check_workers_agree_on_step(self) -> None:
    """Refuses a resume some workers cannot see (they would diverge)."""
    if num_workers(self.strategy) <= 1:
      return
    step = self.step
    total = int(sync.host_value_sum(self.strategy)(step))
    if total != step * self.replicas:
      raise UserError(
          f"this worker is at step {step} after restoring --workdir="
          f"{self.workdir}, but the workers disagree (sum of steps "
          f"{total}); put the workdir on storage every worker sees "
          "(shared disk or gs://).")

  def datasets(self):
    cfg, seed = self.config, self.config.runtime.seed
    # Resumed runs start where the checkpointed step left the data stream.
    train = data_lib.distribute(self.strategy, cfg.data, "train",
                                cfg.train.global_batch_size, seed,
                                start_step=self.step, spec=self.spec)
    evals = data_lib.distribute(self.strategy, cfg.data, "eval",
                                cfg.train.global_batch_size, seed,
                                steps=cfg.eval.steps, spec=self.spec)
    return train, evals

  def run(self) -> dict:
    """Trains to `train.steps`, evaluating and checkpointing on the way."""
    cfg = self.config
    if self.chief:
      workdir_lib.write_json(self.workdir, workdir_lib.CONFIG_JSON,
                             cfg.to_dict())
    self.summaries.config(cfg.to_dict())
    rule = lr_lib.describe(cfg.train)
    if rule:
      self.log(rule)
    self.summaries.sync_layout()
    self.utilisation = mfu_lib.for_run(self.model, self.strategy, cfg,
                                       num_workers(self.strategy), self.chief)
    if self.utilisation.flops.uncounted:
      self.log("FLOPs counted as 0 (layers not known): "
               + "; ".join(self.utilisation.flops.uncounted))
    train_ds, eval_ds = self.datasets()
    options = {"global_clipnorm": cfg.train.global_clipnorm,
               "jit_compile": cfg.train.jit_compile,
               "allreduce_dtype": cfg.runtime.allreduce_dtype,
               "bytes_per_pack": cfg.runtime.bytes_per_pack}
    steps = {timed: step_lib.make_train_step(
        self.strategy, self.model, self.optimizer,
        cfg.train.global_batch_size, timed=timed, **options)
             for timed in (False, True)}
    if cfg.train.steps_per_loop > 1:
      steps["many"] = step_lib.make_multi_step(
          self.strategy, self.model, self.optimizer,
          cfg.train.global_batch_size, **options)
    eval_pass = step_lib.make_eval_pass(self.strategy, self.model)
    throughput = Throughput(cfg.train.global_batch_size)
    sync_log = sync.SyncLog()
    iterator = iter(train_ds)
    with _Profiler(cfg.log.profile_steps, self.workdir, self.chief) as prof, \
        preemption.StopRequest(self.strategy,
                               num_workers(self.strategy) > 1,
                               cfg.train.log_every) as stop:
      last = self._train_loop(steps, iterator, (eval_pass, eval_ds),
                              throughput, sync_log, prof, stop)
    final_eval = step_lib.evaluate(eval_pass, eval_ds)
    self._log_eval(final_eval)
    self.manager.save(checkpoint_number=self.step)
    calibrated = self._calibrate(iterator, throughput, sync_log)
    return self._finish(last, final_eval, throughput, sync_log, calibrated)

  def _calibrate(self, iterator, throughput, sync_log) -> dict:
    """The no-communication baseline and the all-reduce model check."""
    steps = self.calibration_steps
    if not steps or not throughput.step_seconds:
      return {}
    real_ms = 1e3 * throughput.step_seconds
    ideal_ms = calibration.no_communication_step_ms(
        self.strategy, self.model, iterator,
        self.config.train.global_batch_size, steps)
    measured = sync_log.means().get("allreduce_ms")
    out = {"ideal_step_ms": ideal_ms, "ideal_speedup": real_ms / ideal_ms,
           **calibration.allreduce_model_check(
               self.strategy, self.gradient_bytes, measured,
               deterministic=num_workers(self.strategy) > 1)}
    self.log(f"step {real_ms:.1f} ms; with free communication (no all-reduce,"
             f" no update) {ideal_ms:.1f} ms: ideal speedup "
             f"x{out['ideal_speedup']:.2f}")
    if out.get("allreduce_fit_error"):
      self.log(f"all-reduce model not fitted: {out['allreduce_fit_error']}")
    elif measured is not None and self.replicas > 1:
      self.log(f"all-reduce of {self.gradient_bytes:,} gradient bytes: measured "
               f"{measured:.2f} ms, alpha-beta model "
               f"{out['allreduce_predicted_ms']:.2f} ms (alpha "
               f"{out['allreduce_alpha_us']:.0f} us, bus bandwidth "
               f"{out['allreduce_bandwidth_GBps']:.2f} GB/s)")
    return out

  def _timed(self, step: int) -> bool:
    """Whether `step` is instrumented: the logged ones, and step 1 to warm
    the instrumented function up (its breakdown is discarded)."""
    cfg = self.config.train
    return self.sync_timing and (
        step == 1 or step % cfg.log_every == 0 or step == cfg.steps)

  def _train_loop(self, steps, iterator, evals, throughput, sync_log,
                  profiler, stop):
    cfg = self.config.train
    last = {"loss": None, "accuracy": None}
    window = _Window()
    while self.step < cfg.steps:
      timed = self._timed(self.step + 1)
      n = 1 if timed else self._call_size(self.step, profiler)
      with profiler.step(self.step + 1):
        out = (steps["many"](iterator, tf.constant(n)) if n > 1
               else steps[timed](iterator))
      window.add(out["loss"].numpy(), out["correct"].numpy(),
                 int(out["steps"]) if n > 1 else 1)
      step = self.step
      # Every step, before anything is saved: a non-finite update must never
      # reach a checkpoint.
      self._check_finite(step, out)
      if timed and step > 1:
        window.breakdown = sync.breakdown(out["step_start"].numpy(),
                                          out["inputs_ready"].numpy(),
                                          out["stamps"].numpy(),
                                          out["collective_waits"].numpy())
      if step % cfg.log_every == 0 or step == cfg.steps:
        last = self._log_train(step, window, throughput, sync_log)
        window = _Window()
      window.pause()  # Checkpoints and eval are not train-step time.
      if stop.should_stop(step):
        path = self.manager.save(checkpoint_number=step)
        raise errors.Preempted(
            f"stopped by SIGTERM after step {step}; checkpoint "
            f"{os.path.basename(path)} saved in {self.checkpoint_dir}; rerun "
            "the same command to resume from it.")
      if step % cfg.checkpoint_every == 0 and step < cfg.steps:
        self.manager.save(checkpoint_number=step)
      if self.config.eval.every and step % self.config.eval.every == 0 \
          and step < cfg.steps:
        self._log_eval(step_lib.evaluate(*evals))
      window.resume()
    return last

  def _call_size(self, step: int, profiler) -> int:
    """Plain steps for the next call: up to train.steps_per_loop, never past
    a step the host must see (log, timed, checkpoint, eval, end, profile)."""
    cfg = self.config.train
    if cfg.steps_per_loop <= 1 or profiler.covers(step + 1):
      return 1
    stops = [cfg.steps, _next_multiple(step, cfg.log_every),
             _next_multiple(step, cfg.checkpoint_every)]
    if self.config.eval.every:
      stops.append(_next_multiple(step, self.config.eval.every))
    if profiler.start and step < profiler.start:
      stops.append(profiler.start - 1)
    target = min(stops)
    if self._timed(target):  # A timed step runs alone: stop just before it.
      target -= 1
    return max(1, min(cfg.steps_per_loop, target - step))

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
    latest = tf.train.latest_checkpoint(self.checkpoint_dir)
    kept = (f"the last good checkpoint ({os.path.basename(latest)}) is kept"
            if latest else "no checkpoint was saved before it")
    raise errors.Diverged(
        f"loss {loss} and gradient norm {norm} at step {step}: training "
        f"diverged; {kept}. Lower train.learning_rate or set "
        "train.global_clipnorm, then rerun to resume from it.")

  def _log_train(self, step, window, throughput, sync_log) -> dict:
    cfg = self.config.train
    seconds = window.elapsed()
    loss = window.loss_sum / window.steps
    # Language models predict every token: accuracy is per token.
    predictions = self.spec.shape[0] if self.spec.per_token else 1
    accuracy = window.correct / (window.steps * cfg.global_batch_size
                                 * predictions)
    values = {"loss": loss, "accuracy": accuracy,
              "learning_rate": lr_lib.last_applied(self.optimizer)}
    if self.spec.per_token:  # The loss is the mean per token: exp is perplexity.
      values["perplexity"] = float(np.exp(min(loss, 50.0)))
    scale = step_lib.loss_scale_of(self.optimizer)
    if scale is not None:
      values["train/loss_scale"] = float(scale.numpy())
      values["train/skipped_steps"] = self.skipped_steps
    if throughput.add(window.steps, seconds):
      step_s = seconds / window.steps
      eps = cfg.global_batch_size / step_s
      values.update({"perf/step_ms": 1e3 * step_s,
                     "perf/examples_per_sec": eps,
                     "perf/examples_per_sec_per_replica": eps / self.replicas,
                     **self.utilisation.scalars(eps)})
    if window.breakdown:  # Its function was warmed up at step 1.
      values.update(sync_log.add(window.breakdown))
      values["sync/gradient_bytes"] = self.gradient_bytes
    self.summaries.scalars(step, values)
    remaining = (cfg.steps - step) * (throughput.step_seconds
                                      or seconds / window.steps)
    rate = values.get("perf/examples_per_sec")
    self.log(f"step {step:>{len(str(cfg.steps))}}/{cfg.steps}  "
             f"loss {loss:.4f}  acc {accuracy:.3f}  "
             + (f"{rate:,.0f} ex/s  " if rate else "(warm-up)  ")
             + f"ETA {_eta(remaining)}")
    return values

  def _log_eval(self, result: dict) -> None:
    values = {"eval/accuracy": result["accuracy"], "eval/loss": result["loss"]}
    if self.spec.per_token:
      values["eval/perplexity"] = float(np.exp(min(result["loss"], 50.0)))
    self.summaries.scalars(self.step, values)
    self.log(f"eval at step {self.step}: accuracy {result['accuracy']:.4f}  "
             f"loss {result['loss']:.4f}  ({result['examples']} examples)")

  def _finish(self, last, final_eval, throughput, sync_log,
              calibrated) -> dict:
    means = sync_log.means()
    step_stats = step_time_stats(throughput.window_ms)
    if throughput.examples_per_sec:
      self.log(throughput_line(throughput.examples_per_sec, step_stats))
    summary = {
        "strategy": strategy_lib.display_name(self.strategy),
        "replicas": self.replicas,
        "steps": self.step,
        "global_batch_size": self.config.train.global_batch_size,
        "peak_learning_rate": lr_lib.peak(self.config.train),
        "train_loss": last.get("loss"),
        "train_accuracy": last.get("accuracy"),
        "eval_accuracy": final_eval["accuracy"],
        "eval_loss": final_eval["loss"],
        "eval_examples": final_eval["examples"],
        "examples_per_sec": throughput.examples_per_sec,
        "examples_per_sec_per_replica": (
            throughput.examples_per_sec / self.replicas
            if throughput.examples_per_sec else None),
        # Wall ms per step over the log windows (the warm-up one left out).
        **step_stats,
        "gradient_bytes": self.gradient_bytes,
        # Means over the instrumented steps (None with log.sync_timing off).
        "sync_fraction": means.get("fraction"),
        **{k: means.get(k) for k in (*sync.SyncLog.COMPONENTS, "step_ms")},
        "skipped_steps": self.skipped_steps,
        "ideal_step_ms": None, "ideal_speedup": None,
        **calibrated,
        **self.utilisation.summary(throughput.examples_per_sec),
    }
    self.log(self.utilisation.line(throughput.examples_per_sec))
    self.summaries.flush()
    if self.chief:
      workdir_lib.save_model(self.workdir, self.model)
      workdir_lib.write_json(self.workdir, workdir_lib.SUMMARY_JSON, summary)
    return summary


class _Profiler:
  """TF profiler trace of train steps START..STOP on the chief.

  Each step is marked (`Trace(step_num=...)`) so tools/profile_collectives.py
  can tie collectives to steps; the trace stops one step after STOP because
  the last step's collective events are written just after it returns.
  """

  def __init__(self, spec: str, logdir: str, chief: bool):
    self.start, self.stop = parse_profile_steps(spec)
    self.logdir, self.enabled, self.active = logdir, chief and self.start, False

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    """Stops a trace still running when training ends (STOP near the end)."""
    if self.active:
      tf.profiler.experimental.stop()
      self.active = False

  def covers(self, step: int) -> bool:
    """Whether `step` is traced (or closes the trace): it runs alone.

    Decided from the spec, not from `enabled` (chief only): every worker must
    group steps into calls alike, or their collectives would not match."""
    return bool(self.start) and self.start <= step <= self.stop + 2

  def step(self, step: int):
    if not self.enabled:
      return contextlib.nullcontext()
    if step == self.start:
      tf.profiler.experimental.start(self.logdir)
      self.active = True
    elif self.active and step == self.stop + 2:
      tf.profiler.experimental.stop()
      self.active = False
    if self.active and step <= self.stop:
      return tf.profiler.experimental.Trace("train", step_num=step, _r=1)
    return contextlib.nullcontext()


def _next_multiple(step: int, every: int) -> int:
  """The first multiple of `every` after `step`."""
  return (step // every + 1) * every


def parse_profile_steps(spec: str) -> tuple[int, int]:
  """'START,STOP' -> (START, STOP); '' -> (0, 0). Raises UserError."""
  if not spec:
    return 0, 0
  try:
    start, stop = (int(x) for x in spec.split(","))
  except ValueError:
    start = stop = -1
  if not 2 <= start <= stop:
    raise UserError(f"log.profile_steps={spec!r} must be 'START,STOP' with "
                    "2 <= START <= STOP (step 1 traces the function).")
  return start, stop


class _Window:
  """Sums over the steps since the last log line."""

  def __init__(self):
    self.loss_sum, self.correct, self.steps = 0.0, 0.0, 0
    self.breakdown = None  # sync.breakdown of the window's timed step.
    self._seconds = 0.0
    self._start = time.perf_counter()

  def pause(self):
    self._seconds += time.perf_counter() - self._start

  def resume(self):
    self._start = time.perf_counter()

  def add(self, loss, correct, steps: int = 1):
    """Adds the loss and correct counts SUMMED over `steps` steps."""
    self.loss_sum += float(loss)
    self.correct += float(correct)
    self.steps += steps

  def elapsed(self) -> float:
    return self._seconds + time.perf_counter() - self._start


def train(config, workdir: str, strategy) -> dict:
  """Trains `config` under `strategy` into `workdir`; returns summary.json."""
  trainer = Trainer(config, workdir, strategy)
  try:
    return trainer.run()
  finally:
    trainer.close()
