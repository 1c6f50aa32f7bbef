"""A run, assembled and trained: what `dist_keras.fit` and the command
line (`python -m dist_keras.train`) both call, once each has resolved its
arguments at its door (a validated config, a Strategy, the user's functions
or the config's names, callbacks). `build` is the whole run, top to bottom;
a built-in and a user's model take the same path.
"""
import dataclasses

import keras
import tensorflow as tf

from dist_keras import errors, registry
from dist_keras.contract import checks
from dist_keras.distribute import pipelines, strategies
from dist_keras.training import allreduce, checkpoints, compiled, loop, lr
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
    try:
      summary = trainer.run()
    except tf.errors.InvalidArgumentError as e:
      bad = errors.bad_data_value(e)
      if bad is None:
        raise
      raise bad from e
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
  allreduce.check_same_config(strategy, config.to_dict())
  model_fn, dataset_fn = registry.resolve(config, *job.functions)
  resume = checkpoints.find_resume(workdir)  # Where the data resumes.
  keras.utils.set_random_seed(config.runtime.seed)
  model = checks.call_model_fn(model_fn, strategy, config.train.precision)
  notes = compiled.take(model, strategy, config.train)
  callbacks, note = user_callbacks.collect(
      config.train.callbacks, job.callbacks, model, config.train)
  notes += [note] if note else []
  feed = pipelines.Feed(config.train.global_batch_size,
                        config.data.pipeline_per_replica)
  train_ds, batch_spec = pipelines.distribute(
      strategy, dataset_fn, "train", feed, start_step=resume.step)
  eval_ds, eval_spec = pipelines.distribute(
      strategy, dataset_fn, "eval", feed, eval_steps=config.eval.steps)
  # Loss and metrics state, from the batches of both splits.
  checks.build_state(model, strategy, batch_spec, eval_spec)
  # The batch-size rule, then every optimizer built in scope (a replica
  # function may not create slots), with the gradient all-reduce where the
  # step needs it (compiled.py).
  rate = lr.apply(model.optimizer, config.train)
  optimizers = compiled.prepare_optimizers(model, strategy)
  saved, resumed = checkpoints.restored(
      workdir, model, optimizers, strategy, config.train.max_checkpoints,
      resume)
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  parts = loop.Parts(strategy, model, train_ds, eval_ds, saved, rate,
                     callbacks)
  notes += settings.notes(config, on_tpu) + ([resumed] if resumed else [])
  return loop.Trainer(parts, settings.Settings.from_config(config, on_tpu),
                      workdir, config.to_dict(), notes=notes)
