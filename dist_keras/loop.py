"""The distributed training loop: `strategy.run` steps, eval, checkpoints.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585), so dist_keras owns its loop: the same code runs on
one device, N local replicas, N workers and TPU cores, for any compiled
Keras model (`model_fn`) and tf.data input (`dataset_fn`); see contract.py.
"""
import contextlib
import os
import shutil
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from dist_keras import calibration
from dist_keras import contract
from dist_keras import data as data_lib
from dist_keras import errors
from dist_keras import lr as lr_lib
from dist_keras import mfu as mfu_lib
from dist_keras import preemption, profiler as profiler_lib
from dist_keras import step as step_lib, sync, timing, workdir as workdir_lib
from dist_keras import strategy as strategy_lib
from dist_keras.errors import UserError
from dist_keras.summaries import Summaries

# Iterating a distributed dataset inside tf.function reads its options in
# graph mode, which warns on every eval trace; the behaviour is intended.
warnings.filterwarnings(
    "ignore", message="To make it possible to preserve tf.data options")


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


def checkpointed_step(checkpoint_dir: str) -> int:
  """The step of the latest checkpoint in `checkpoint_dir` (0: none).

  Checkpoints are numbered by step (ckpt-STEP), so the step is known before
  the model exists: the train stream is built to resume there.
  """
  latest = tf.train.latest_checkpoint(checkpoint_dir)
  return int(latest.rsplit("-", 1)[1]) if latest else 0


def distribute(strategy, dataset_fn, split: str, config, start_step: int = 0):
  """`dataset_fn`'s pipelines of `split` for the strategy's replicas, and
  their element spec.

  Each pipeline's dataset is checked against the contract; the train
  stream skips the `start_step` steps already trained (every pipeline
  feeds num_replicas / num_pipelines batches per step), eval stops after
  eval.steps steps when set.
  """
  replicas = strategy.num_replicas_in_sync
  data_lib.per_replica_batch_size(config.train.global_batch_size, replicas)
  eval_steps, specs = config.eval.steps, []

  def make(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    ds = dataset_fn(split, ctx)
    contract.check_dataset(ds, split, config.train.global_batch_size,
                           replicas, eval_steps)
    specs.append(ds.element_spec)
    per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
    if split == "train" and start_step:
      ds = ds.skip(start_step * per_pipeline)
    if split == "eval" and eval_steps:
      ds = ds.take(eval_steps * per_pipeline)
    return ds

  options = None
  if config.data.pipeline_per_replica:
    # Batches stay on the host, where each replica's pipeline runs (TF 2.21
    # would also prefetch them to the devices; only the batches' contents
    # matter for the equivalence this mode exists for).
    options = tf.distribute.InputOptions(
        experimental_replication_mode=(
            tf.distribute.InputReplicationMode.PER_REPLICA),
        experimental_fetch_to_device=False)
  # distribute_datasets_from_function never auto-shards: each pipeline
  # reads the shard its dataset_fn picks by input_pipeline_id.
  with _input_devices_kept(strategy):
    dataset = strategy.distribute_datasets_from_function(make, options)
  return dataset, specs[0]


@contextlib.contextmanager
def _input_devices_kept(strategy):
  """Undoes what a PER_REPLICA distribution does to a MirroredStrategy.

  TF 2.21's MirroredStrategy keeps the per-replica input devices of such a
  call (`_input_workers_with_options` assigns `_input_workers_devices`), so
  every later dataset of that strategy object got one pipeline per replica
  too: a second run in one process read its data twice over. Restored here,
  in this one place; tests/test_data.py fails if TensorFlow moves it.
  """
  extended = strategy.extended
  saved = getattr(extended, "_input_workers_devices", None)
  try:
    yield
  finally:
    if saved is not None:
      extended._input_workers_devices = saved  # pylint: disable=protected-access


class Trainer:
  """One training run of `model_fn` on `dataset_fn` into `workdir`."""

  def __init__(self, config, workdir: str, strategy, model_fn, dataset_fn):
    self.config, self.workdir, self.strategy = config, workdir, strategy
    self.replicas = strategy.num_replicas_in_sync
    self.chief = is_chief(strategy)
    # Said at the start of run(), after the header: nothing is printed
    # before every check has passed.
    self._notes = self._timing_settings()
    self.checkpoint_dir = os.path.join(workdir, workdir_lib.CHECKPOINTS)
    start_step = checkpointed_step(self.checkpoint_dir)
    # Everything below is checked before anything is written.
    keras.utils.set_random_seed(config.runtime.seed)
    self.model = contract.call_model_fn(model_fn, strategy,
                                        config.train.precision)
    self.train_ds, batch_spec = distribute(strategy, dataset_fn, "train",
                                           config, start_step)
    self.eval_ds, _ = distribute(strategy, dataset_fn, "eval", config)
    contract.build_state(self.model, strategy, batch_spec)
    self.optimizer = self._prepare_optimizer()
    self.gradient_bytes = sync.gradient_bytes(
        self.model.trainable_variables, config.runtime.allreduce_dtype)
    self.skipped_steps = 0  # float16 loss scaling: overflowed, not applied.
    self._open_checkpoints(start_step)
    if self.chief:
      workdir_lib.prepare(workdir)
    self.summaries = Summaries(workdir, self.chief and config.log.tensorboard)

  def _timing_settings(self) -> list[str]:
    """Sets what is timed; returns the notes a run starts with."""
    # tf.timestamp has no TPU kernel: on a TPU the step breakdown and the
    # calibration (which times steps the same way) are off, said once.
    cfg, notes = self.config.log, []
    on_tpu = isinstance(self.strategy, tf.distribute.TPUStrategy)
    self.sync_timing = cfg.sync_timing and not on_tpu
    self.calibration_steps = 0 if on_tpu else cfg.calibration_steps
    if on_tpu and (cfg.sync_timing or cfg.calibration_steps):
      notes.append("TPU: log.sync_timing and log.calibration_steps are off "
                   "(tf.timestamp has no TPU kernel)")
    if self.config.data.name == data_lib.SYNTHETIC:
      notes.append(data_lib.constant_batch.NOTE)
    return notes

  def _prepare_optimizer(self):
    """The compiled optimizer with the batch-size rule applied, its slots
    built in scope (a replica function may not create them) and its own
    per-replica all-reduce off (the step reduces once, explicitly)."""
    optimizer = self.model.optimizer
    self.rate = lr_lib.apply(optimizer, self.config.train)
    with self.strategy.scope():
      optimizer.build(self.model.trainable_variables)
    sync.disable_optimizer_allreduce(optimizer)
    return optimizer

  def _open_checkpoints(self, start_step: int) -> None:
    """The checkpoint of every model variable (weights, non-trainable state
    such as BatchNorm statistics, dropout's seed-generator state) and every
    optimizer variable, restored if the workdir has one.

    Every worker takes part in a save (TF's multi-worker pattern), but only
    the chief's lands in the workdir; the others write to a private
    temporary folder, deleted by close().
    """
    self.checkpoint = tf.train.Checkpoint(
        model_variables=list(self.model.variables),
        optimizer_variables=list(self.optimizer.variables))
    self._scratch = None if self.chief else tempfile.mkdtemp(
        prefix="dist_keras_worker_")
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self._scratch or self.checkpoint_dir,
        max_to_keep=1 if self._scratch else self.config.train.max_checkpoints)
    self.restore(start_step)

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def log(self, message: str) -> None:
    if self.chief and self.config.log.progress:
      print(message, flush=True)

  def close(self) -> None:
    """Closes the summaries and deletes a non-chief's scratch checkpoints."""
    summaries = getattr(self, "summaries", None)
    if summaries:
      summaries.close()
    if getattr(self, "_scratch", None):
      shutil.rmtree(self._scratch, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def restore(self, start_step: int) -> int:
    """Restores the latest checkpoint, if any; returns the step reached.

    Every worker reads the CHIEF's checkpoint folder, so a multi-worker
    resume needs a workdir all workers see (shared disk or gs://).
    """
    latest = tf.train.latest_checkpoint(self.checkpoint_dir)
    if latest:
      try:
        self.checkpoint.restore(latest).assert_consumed()
      except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise UserError(
            f"--workdir={self.workdir} holds a checkpoint ({latest}) made by "
            "a different model or optimizer; resume it with the config.json "
            "saved there, or pass a new --workdir.") from e
      if self.step != start_step:
        raise UserError(f"checkpoint {latest} holds step {self.step}, not "
                        f"{start_step}; it was renamed: pass a new --workdir.")
      self._notes.append(f"resumed from {latest} at step {self.step}")
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

  def run(self) -> dict:
    """Trains to `train.steps`, evaluating and checkpointing on the way."""
    cfg = self.config
    for note in self._notes:
      self.log(note)
    if self.chief:
      workdir_lib.write_json(self.workdir, workdir_lib.CONFIG_JSON,
                             cfg.to_dict())
    self.summaries.config(cfg.to_dict())
    if self.rate.line:
      self.log(self.rate.line)
    self.summaries.sync_layout()
    self.utilisation = mfu_lib.for_run(self.model, self.strategy, cfg,
                                       num_workers(self.strategy), self.chief)
    if self.utilisation.flops.uncounted:
      self.log("FLOPs counted as 0 (layers not known): "
               + "; ".join(self.utilisation.flops.uncounted))
    self.read_metrics = step_lib.make_metrics_reader(self.model)
    self.eval_pass = step_lib.make_eval_pass(self.strategy, self.model)
    steps = self._step_functions()
    throughput = timing.Throughput(cfg.train.global_batch_size)
    sync_log = sync.SyncLog()
    iterator = iter(self.train_ds)
    with profiler_lib.Profiler(cfg.log.profile_steps, self.workdir,
                               self.chief) as prof, \
        preemption.StopRequest(self.strategy,
                               num_workers(self.strategy) > 1,
                               cfg.train.log_every) as stop:
      last = self._train_loop(steps, iterator, throughput, sync_log, prof,
                              stop)
    final_eval = self.evaluate()
    self.manager.save(checkpoint_number=self.step)
    calibrated = self._calibrate(iterator, throughput, sync_log)
    return self._finish(last, final_eval, throughput, sync_log, calibrated)

  def _step_functions(self) -> dict:
    cfg = self.config
    options = {"jit_compile": cfg.train.jit_compile,
               "allreduce_dtype": cfg.runtime.allreduce_dtype,
               "bytes_per_pack": cfg.runtime.bytes_per_pack}
    steps = {timed: step_lib.make_train_step(
        self.strategy, self.model, self.optimizer, timed=timed, **options)
             for timed in (False, True)}
    if cfg.train.steps_per_loop > 1:
      steps["many"] = step_lib.make_multi_step(
          self.strategy, self.model, self.optimizer, **options)
    return steps

  def evaluate(self) -> dict:
    """One pass of the eval split, logged; resets the compiled metrics."""
    result = step_lib.evaluate(self.eval_pass, self.read_metrics, self.model,
                               self.eval_ds)
    self.model.reset_metrics()
    metrics = {k: v for k, v in result.items() if k != "examples"}
    values = {f"eval/{name}": value for name, value in metrics.items()}
    if self.config.log.perplexity:
      values["eval/perplexity"] = _perplexity(result["loss"])
    self.summaries.scalars(self.step, values)
    self.log(f"eval at step {self.step}: {_metrics_text(metrics)}  "
             f"({result['examples']} examples)")
    return result

  def _calibrate(self, iterator, throughput, sync_log) -> dict:
    """The no-communication baseline and the all-reduce model check."""
    steps = self.calibration_steps
    if not steps or not throughput.step_seconds:
      return {}
    real_ms = 1e3 * throughput.step_seconds
    ideal_ms = calibration.no_communication_step_ms(
        self.strategy, self.model, self.optimizer, iterator, steps)
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

  def _train_loop(self, steps, iterator, throughput, sync_log, profiler,
                  stop):
    cfg = self.config.train
    last = {"loss": None}
    window = timing.Window()
    while self.step < cfg.steps:
      out = self._run_steps(steps, iterator, profiler)
      window.add(out["loss"].numpy(), int(out.get("steps", 1)))
      step = self.step
      # Every step, before anything is saved: a non-finite update must never
      # reach a checkpoint.
      self._check_finite(step, out)
      if "stamps" in out and step > 1:
        window.breakdown = sync.breakdown(out["step_start"].numpy(),
                                          out["inputs_ready"].numpy(),
                                          out["stamps"].numpy(),
                                          out["collective_waits"].numpy())
      evaluating = self._is_eval_step(step)
      # The compiled metrics hold this window's state: log them before an
      # eval pass resets them.
      if step % cfg.log_every == 0 or step == cfg.steps or (
          evaluating and window.steps):
        last = self._log_train(step, window, throughput, sync_log)
        window = timing.Window()
      window.pause()  # Checkpoints and eval are not train-step time.
      if stop.should_stop(step):
        path = self.manager.save(checkpoint_number=step)
        raise errors.Preempted(
            f"stopped by SIGTERM after step {step}; checkpoint "
            f"{os.path.basename(path)} saved in {self.checkpoint_dir}; rerun "
            "the same command to resume from it.")
      if step % cfg.checkpoint_every == 0 and step < cfg.steps:
        self.manager.save(checkpoint_number=step)
      if evaluating:
        self.evaluate()
      window.resume()
    return last

  def _is_eval_step(self, step: int) -> bool:
    every = self.config.eval.every
    return bool(every) and step % every == 0 and step < self.config.train.steps

  def _run_steps(self, steps, iterator, profiler) -> dict:
    """One call of a step function: a timed step, or up to steps_per_loop
    plain ones; a train stream that runs dry is the user's to fix."""
    timed = self._timed(self.step + 1)
    n = 1 if timed else self._call_size(self.step, profiler)
    try:
      with profiler.step(self.step + 1):
        if n > 1:
          return steps["many"](iterator, tf.constant(n))
        return steps[timed](iterator)
    except (tf.errors.OutOfRangeError, StopIteration) as e:
      raise UserError(
          f"dataset_fn('train', ...) ran out of batches at step "
          f"{self.step + 1}; repeat it (ds.repeat()) so training runs "
          f"train.steps={self.config.train.steps} steps.") from e

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
        f"diverged; {kept}. Lower the learning rate or clip the gradient "
        "norm (train.global_clipnorm, or the optimizer's global_clipnorm), "
        "then rerun to resume from it.")

  def _log_train(self, step, window, throughput, sync_log) -> dict:
    cfg = self.config.train
    seconds = window.elapsed()
    loss = window.loss_sum / window.steps
    metrics = {name: float(value) for name, value in
               self.read_metrics().items()}
    self.model.reset_metrics()  # The next window starts from zero.
    values = {"loss": loss, **metrics,
              "learning_rate": lr_lib.last_applied(self.optimizer)}
    if self.config.log.perplexity:
      values["perplexity"] = _perplexity(loss)
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
             f"{_metrics_text({'loss': loss, **metrics})}  "
             + (f"{rate:,.0f} ex/s  " if rate else "(warm-up)  ")
             + f"ETA {timing.eta(remaining)}")
    return {"loss": loss, **metrics}

  def _finish(self, last, final_eval, throughput, sync_log,
              calibrated) -> dict:
    means = sync_log.means()
    step_stats = timing.step_time_stats(throughput.window_ms)
    if throughput.examples_per_sec:
      self.log(timing.throughput_line(throughput.examples_per_sec, step_stats))
    eps = throughput.examples_per_sec
    summary = {
        "strategy": strategy_lib.display_name(self.strategy),
        "replicas": self.replicas,
        "steps": self.step,
        "global_batch_size": self.config.train.global_batch_size,
        "dtype_policy": self.model.dtype_policy.name,
        "base_learning_rate": self.rate.base,
        "peak_learning_rate": self.rate.peak,
        **{f"train_{name}": value for name, value in last.items()},
        **{f"eval_{name}": value for name, value in final_eval.items()},
        "examples_per_sec": eps,
        "examples_per_sec_per_replica": eps / self.replicas if eps else None,
        # Wall ms per step over the log windows (the warm-up one left out).
        **step_stats,
        "gradient_bytes": self.gradient_bytes,
        # Means over the instrumented steps (None with log.sync_timing off).
        "sync_fraction": means.get("fraction"),
        **{k: means.get(k) for k in (*sync.SyncLog.COMPONENTS, "step_ms")},
        "skipped_steps": self.skipped_steps,
        "ideal_step_ms": None, "ideal_speedup": None,
        **calibrated,
        **self.utilisation.summary(eps),
    }
    self.log(self.utilisation.line(eps))
    self.summaries.flush()
    if self.chief:
      workdir_lib.save_model(self.workdir, self.model)
      workdir_lib.write_json(self.workdir, workdir_lib.SUMMARY_JSON, summary)
    return summary


def _metrics_text(values: dict) -> str:
  """'loss 0.1234  accuracy 0.912': the loss first, then each metric."""
  ordered = {"loss": values["loss"], **values}
  return "  ".join(f"{name} {value:.4f}" if name == "loss" or abs(value) < 1e4
                   else f"{name} {value:.4g}"
                   for name, value in ordered.items())


def _perplexity(loss: float) -> float:
  """exp(mean per-token cross-entropy), capped where exp overflows."""
  return float(np.exp(min(loss, 50.0)))


def _next_multiple(step: int, every: int) -> int:
  """The first multiple of `every` after `step`."""
  return (step // every + 1) * every
