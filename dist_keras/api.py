"""A run, assembled and trained: what `dist_keras.fit` and the command
line (`python -m dist_keras.train`) both call, once each has resolved its
arguments at its door (a validated config, a Strategy, the user's functions
or the config's names, callbacks). `build` is the whole run, top to bottom;
a built-in and a user's model take the same path.
"""
import dataclasses

import keras
import tensorflow as tf

from dist_keras import data, registry
from dist_keras.contract import checks, imports
from dist_keras.distribute import pipelines, strategies
from dist_keras.errors import UserError
from dist_keras.training import checkpoints, compiled, loop, lr, model_step
from dist_keras.training import report, settings, user_callbacks


@dataclasses.dataclass
class FitResult:
  """What `fit` returns.

  Attributes:
    model: the trained Keras model (also saved as workdir/model.keras).
    summary: summary.json's fields: the strategy, replicas and steps, the
      final train and eval loss and every compiled metric (`train_NAME`,
      `eval_NAME`), throughput, the sync breakdown and MFU.
    workdir: where the run wrote its files.
    history: {name: [value per epoch]}, as `model.fit(...).history` (an
      epoch is one eval interval; this run's epochs only).
  """
  model: keras.Model
  summary: dict
  workdir: str
  history: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Job:
  """A run as its door resolved it (dist_keras.fit, the command line).

  Attributes:
    config: the validated config (validate.config).
    workdir: the run's folder.
    strategy: the tf.distribute.Strategy to train under; None: the one
      config.runtime names (made once, here: TensorFlow has started).
    functions: (model_fn, dataset_fn); None for the config's name.
    callbacks: the user's Keras callbacks; None: train.callbacks'.
  """
  config: object
  workdir: str
  strategy: object = None
  functions: tuple = (None, None)
  callbacks: list | None = None


def run(job: Job) -> FitResult:
  """Builds the run, trains it and reports."""
  with build(job) as trainer:
    talk = trainer.chief and job.config.log.progress
    if talk:
      print(report.header(trainer.strategy, job.workdir), flush=True)
    summary = trainer.run()
  if talk:
    print(report.footer(summary, job.workdir), flush=True)
  return FitResult(trainer.model, summary, job.workdir,
                   dict(trainer.history.history))


def build(job: Job) -> loop.Trainer:
  """The whole run, in order, built but not trained (tools and tests that
  drive steps themselves use it too; use the Trainer in a `with`: it closes
  its writers and scratch files). Everything is checked before anything is
  written: the Trainer's constructor makes the workdir, last."""
  config, workdir = job.config, job.workdir
  strategy = job.strategy or strategies.get_strategy(config.runtime)
  model_fn, dataset_fn = registry.resolve(config, *job.functions)
  callbacks = _callbacks(config.train, job.callbacks)
  resume = checkpoints.find_resume(workdir)  # Where the data resumes.
  keras.utils.set_random_seed(config.runtime.seed)
  model = checks.call_model_fn(model_fn, strategy, config.train.precision)
  notes = compiled.take(model, strategy, config.train)
  train_ds, eval_ds, batch_spec = _datasets(config, strategy, dataset_fn,
                                            resume.step)
  checks.build_state(model, strategy, batch_spec)  # Loss and metrics state.
  rate = _prepare_optimizers(model, strategy, config.train)
  saved = _restored(config, workdir, strategy, model, resume)
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  parts = loop.Parts(strategy, model, train_ds, eval_ds, saved.checkpoints,
                     rate, callbacks)
  return loop.Trainer(parts, settings.Settings.from_config(config, on_tpu),
                      workdir, config.to_dict(),
                      notes=notes + _notes(config, on_tpu, saved.line))


def _datasets(config, strategy, dataset_fn, start_step: int):
  """(train, eval) distributed datasets and the train batches' spec."""
  feed = pipelines.Feed(config.train.global_batch_size,
                        config.data.pipeline_per_replica)
  train_ds, batch_spec = pipelines.distribute(
      strategy, dataset_fn, "train", feed, start_step=start_step)
  eval_ds, _ = pipelines.distribute(strategy, dataset_fn, "eval", feed,
                                    eval_steps=config.eval.steps)
  return train_ds, eval_ds, batch_spec


@dataclasses.dataclass
class _Restored:
  checkpoints: checkpoints.Checkpoints
  line: str | None  # "resumed from ..." or None.


def _restored(config, workdir: str, strategy, model,
              resume: checkpoints.Resume) -> _Restored:
  """The run's checkpoints, the latest restored; every worker agreeing."""
  saved = checkpoints.Checkpoints(
      workdir, model, list(model_step.optimizers_of(model).values()),
      strategies.is_chief(strategy), config.train.max_checkpoints)
  try:
    line = saved.restore(resume)
    checkpoints.check_workers_agree(strategy, resume.step,
                                    strategies.num_workers(strategy), workdir)
  except Exception:
    saved.close()
    raise
  return _Restored(saved, line)


def _callbacks(train_cfg, given) -> list:
  """The callbacks passed to fit, or those train.callbacks names."""
  if train_cfg.callbacks and given is not None:
    raise UserError(
        f"callbacks were passed to fit and train.callbacks="
        f"{train_cfg.callbacks!r} names more; pass them one way.")
  if train_cfg.callbacks:
    factory = imports.load("train.callbacks", train_cfg.callbacks)
    given = factory()
  return user_callbacks.check(given)


def _prepare_optimizers(model, strategy, train_cfg) -> lr.Rate:
  """The compiled optimizer with the batch-size rule applied; every
  optimizer built in scope (a replica function may not create slots), with
  the gradient all-reduce where the step needs it (model_step.py)."""
  rate = lr.apply(model.optimizer, train_cfg)
  model_step.prepare_optimizers(
      model, strategy, model_step.overrides(model, "train_step"))
  return rate



def _notes(config, on_tpu: bool, resumed) -> list[str]:
  """What a run says before its first step, after the header."""
  notes = []
  if on_tpu and (config.log.sync_timing or config.log.calibration_steps):
    notes.append("TPU: log.sync_timing and log.calibration_steps are off "
                 "(tf.timestamp has no TPU kernel)")
  if on_tpu and config.train.steps_per_loop == 1:
    notes.append("TPU: train.steps_per_loop=1 returns to the host after "
                 "every step, the usual TPU slowdown; use e.g. "
                 "--config.train.steps_per_loop=50 (docs/tpu_colab.md)")
  if config.data.name == data.SYNTHETIC:
    notes.append(data.constant_batch.NOTE)
  return notes + ([resumed] if resumed else [])
