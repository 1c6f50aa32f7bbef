"""What the loop reads of the config (Settings), and when it logs,
evaluates, checkpoints and times a step (Schedule, big_vision's `itstime`).

The loop is handed a Settings, never the config: what it reads is listed
here, derived once.
"""
import dataclasses

from dist_keras import catalog, installation, validate


@dataclasses.dataclass(frozen=True)
class Schedule:
  """What happens after which step; steps count from 1.

  Attributes:
    steps: train.steps, the last step.
    log_every, checkpoint_every: train.log_every, train.checkpoint_every.
    eval_every: eval.every (0: only the final eval).
    steps_per_loop: train.steps_per_loop, plain steps per call; 0:
      automatic (the loop passes call_size its limit: auto_steps_per_call).
    sync_timing: whether logged steps are instrumented (log.sync_timing, off
      on TPUs).
    profile: (START, STOP) of log.profile_steps, (0, 0) for none.
  """
  steps: int
  log_every: int
  checkpoint_every: int
  eval_every: int
  steps_per_loop: int = 1
  sync_timing: bool = True
  profile: tuple[int, int] = (0, 0)

  def logs(self, step: int) -> bool:
    return step % self.log_every == 0 or step == self.steps

  def says_progress(self, step: int) -> bool:
    """Whether a progress line comes after `step`: a log step or an
    epoch's end."""
    return self.logs(step) or self.ends_epoch(step)

  @property
  def epoch_steps(self) -> int:
    """Steps per epoch: an eval interval (the whole run at eval.every=0);
    every epoch ends with an eval, the last one at train.steps."""
    return self.eval_every or self.steps

  @property
  def epochs(self) -> int:
    return -(-self.steps // self.epoch_steps)

  def epoch_after(self, step: int) -> int:
    """The epoch (from 0) that the step after `step` belongs to."""
    return step // self.epoch_steps

  def epoch_end(self, epoch: int) -> int:
    """The last step of `epoch`."""
    return min((epoch + 1) * self.epoch_steps, self.steps)

  def ends_epoch(self, step: int) -> bool:
    return step % self.epoch_steps == 0 or step == self.steps

  def checkpoints(self, step: int) -> bool:
    """A checkpoint during training (the final one always is saved)."""
    return step % self.checkpoint_every == 0 and step < self.steps

  def timed(self, step: int, first: int = 1) -> bool:
    """Whether `step` is instrumented: the logged ones, and the process's
    `first` step (1, or a resumed run's after its checkpoint's) to warm the
    instrumented function up: the breakdown of the call that traced it is
    discarded (measure/meters.py), which left a resumed run's first logged
    step without one."""
    return self.sync_timing and (step == first or self.logs(step))

  def profiled(self, step: int) -> bool:
    """Whether `step` is traced (or closes the trace): it runs alone.

    Every worker must group steps into calls alike, or their collectives
    would not match: decided from the config, not from who traces.
    """
    start, stop = self.profile
    return bool(start) and start <= step <= stop + 2

  def call_size(self, step: int, auto_limit: int = 1) -> int:
    """Plain steps for the call after `step`: up to steps_per_loop (with
    steps_per_loop=0, up to `auto_limit`), never past a step the host must
    see (log, timed, checkpoint, eval, end, profile)."""
    limit = self.steps_per_loop or auto_limit
    if limit <= 1 or self.profiled(step + 1):
      return 1
    stops = [self.steps, _next_multiple(step, self.log_every),
             _next_multiple(step, self.checkpoint_every)]
    if self.eval_every:
      stops.append(_next_multiple(step, self.eval_every))
    start = self.profile[0]
    if start and step < start:
      stops.append(start - 1)
    target = min(stops)
    if self.timed(target):  # A timed step runs alone: stop just before it.
      target -= 1
    return max(1, min(limit, target - step))


@dataclasses.dataclass(frozen=True)
class Settings:
  """The config values the loop reads, and nothing else of the config."""
  schedule: Schedule
  global_batch_size: int
  step_options: dict  # make_train_step's jit/all-reduce options.
  calibration_steps: int
  divergence_retries: int
  profile_steps: str
  precision: str
  peak_tflops: float
  perplexity: bool
  progress: bool
  progress_seconds: float  # A heartbeat line at least this often; 0: none.
  tensorboard: bool

  @classmethod
  def from_config(cls, config, on_tpu: bool) -> "Settings":
    """On a TPU the stamps behind the breakdown and the calibration have no
    kernel (tf.timestamp): both are off there."""
    train, log = config.train, config.log
    return cls(
        schedule=Schedule(
            train.steps, train.log_every, train.checkpoint_every,
            config.eval.every, train.steps_per_loop,
            sync_timing=log.sync_timing and not on_tpu,
            profile=validate.profile_steps(log.profile_steps)),
        global_batch_size=train.global_batch_size,
        step_options={"jit_compile": train.jit_compile,
                      "allreduce_dtype": config.runtime.allreduce_dtype,
                      "bytes_per_pack": config.runtime.bytes_per_pack},
        calibration_steps=0 if on_tpu else log.calibration_steps,
        divergence_retries=train.divergence_retries,
        profile_steps=log.profile_steps, precision=train.precision,
        peak_tflops=log.peak_tflops, perplexity=log.perplexity,
        progress=log.progress, progress_seconds=log.progress_seconds,
        tensorboard=log.tensorboard)


def notes(config, on_tpu: bool) -> list[str]:
  """What the settings turn off or slow down, said before the first step."""
  said = []
  if on_tpu and (config.log.sync_timing or config.log.calibration_steps):
    said.append("TPU: log.sync_timing and log.calibration_steps are off "
                "(tf.timestamp has no TPU kernel)")
  if on_tpu and config.train.steps_per_loop == 1:
    said.append("TPU: train.steps_per_loop=1 returns to the host after "
                "every step, the usual TPU slowdown; use e.g. "
                "--config.train.steps_per_loop=50 (" + installation.see_docs(
                    "tpu_colab.md", "Colab/TPU",
                    "Multi-worker, Ray, Colab/TPU, Kubernetes") + ")")
  if config.data.name == catalog.SYNTHETIC:
    said.append(SYNTHETIC_NOTE)
  return said


SYNTHETIC_NOTE = ("data.name=synthetic: random constant batches; accuracy is "
                  "meaningless, throughput is compute + sync only")


# train.steps_per_loop=0 on one host: a call lasts about this long at most,
# so a SIGTERM or Ctrl-C (seen between calls) is answered within about a
# second, while steps of tens of ms still run ~50 to a call.
AUTO_CALL_SECONDS = 1.0


def auto_steps_per_call(seconds_per_step, multi_worker: bool) -> int:
  """The call size limit of train.steps_per_loop=0.

  Under multi-worker: no limit (calls end at the next step the host must
  see). Every worker must group steps into calls alike, or their collectives
  would not match, and workers agree on a SIGTERM only at log steps anyway
  (preemption.py). On one host: as many steps as fit in AUTO_CALL_SECONDS
  at `seconds_per_step` (the last log window's), one before it is known.
  """
  if multi_worker:
    return 2**31 - 1
  if not seconds_per_step:
    return 1
  return max(1, int(AUTO_CALL_SECONDS / seconds_per_step))


def _next_multiple(step: int, every: int) -> int:
  """The first multiple of `every` after `step`."""
  return (step // every + 1) * every
