"""A run, assembled and trained: what `dist_keras.fit` and the command
line (`python -m dist_keras.train`) both call, once each has resolved its
arguments at its door (a validated config, a Strategy, the user's functions
or the config's names, callbacks). `build` is the whole run, top to bottom;
a built-in and a user's model take the same path.
"""
import contextlib
import dataclasses
import os

import keras
import tensorflow as tf

from dist_keras import disk, errors, installation, registry, terminal
from dist_keras import validate
from dist_keras.contract import batches, checks, traced_limits, xla_limits
from dist_keras.distribute import leaving, peers, pipelines, reports
from dist_keras.distribute import strategies, tfconfig
from dist_keras.training import allreduce, checkpoints, compiled, loop, lr
from dist_keras.training import model_checks, preemption, process_state
from dist_keras.training import ray_report, run_files, same_model, settings
from dist_keras.training import step_optimizers, unsharded, user_callbacks
from dist_keras.training import varying_slices


@dataclasses.dataclass
class FitResult:
  """What `fit` returns.

  Attributes:
    model: the trained Keras model (also saved in `model_file`).
    summary: summary.json's fields: the strategy, replicas and steps, the
      final train and eval loss and every compiled metric (`train_NAME`,
      `eval_NAME`; no `eval_` field without an eval split), throughput,
      the sync breakdown and MFU.
    workdir: where the run wrote its files.
    history: {name: [value per epoch]}, as `model.fit(...).history` (an
      epoch is one eval interval; this run's epochs only; no `val_` key
      without an eval split).
    model_file: the file the model is saved in: workdir/model.keras, or
      workdir/model.weights.h5 (its weights: `model.load_weights(path)`)
      for a model Keras cannot save whole (no get_config()).
  """
  model: keras.Model
  summary: dict
  workdir: str
  history: dict = dataclasses.field(default_factory=dict)
  model_file: str = ""


@dataclasses.dataclass(frozen=True)
class Job:
  """A run as its door resolved it (dist_keras.fit, the command line).

  Attributes:
    config: the validated config (validate.config).
    workdir: the run's folder.
    strategy: the tf.distribute.Strategy to train under, or the name of
      the one the door chose for config.runtime (tfconfig.chosen; made
      once, here: TensorFlow has started); None: chosen here too.
    functions: (model_fn, dataset_fn); None for the config's name.
    callbacks: the user's Keras callbacks; None: train.callbacks'.
    to_exit: the command line's run, which ends its process: the SIGTERM
      and Ctrl-C handler stays to the exit (a signal after the last line
      changes nothing; a caller of fit gets its own handlers back), and a
      cluster's workers leave together there (train.py), not at exit.
  """
  config: object
  workdir: str
  strategy: object = None
  functions: tuple = (None, None)
  callbacks: list | None = None
  to_exit: bool = False


def run(job: Job) -> FitResult:
  """Builds the run, trains it and reports. The workers of a cluster
  that finished `dist_keras.fit`'s run leave together as their
  interpreters exit (distribute/leaving.py; the command line's leave at
  its end, and Ray Train ends its workers itself)."""
  try:
    # A trace that failed on a layer's name leaves Keras' name-scope stack
    # pushed: the caller's next model would be named under it.
    with installation.keras_name_scopes_kept():
      result, role = _trained(job)
  except BaseException as e:
    leaving.at_exit(None)  # Its peers may never come to the barrier.
    # This worker's own refusal: the others say its line, not a lost peer.
    reports.report(e, tfconfig.from_env())
    if isinstance(e, errors.Preempted) and not job.to_exit:
      # An uncaught SystemExit ends the script without a word: its line
      # now, as the command line's (which says it itself) would be.
      terminal.error(str(e))
    if isinstance(e, errors.Interrupted) and not job.to_exit:
      preemption.end_as_ctrl_c_if_uncaught(e)  # Its line, if uncaught.
    raise
  cluster = tfconfig.from_env()
  if (not job.to_exit and role.workers > 1
      and tfconfig.is_multi_worker(cluster) and ray_report.session() is None):
    leaving.at_exit(cluster)
  return result


def _trained(job: Job) -> tuple[FitResult, strategies.Role]:
  """The run's FitResult, and this process's role in it."""
  ray_report.check_workdir(job.workdir)  # Before anything is written.
  try:
    with build(job) as trainer:
      try:
        summary = _translated_run(trainer)
      except BaseException as e:
        if _nothing_kept(trainer, e):
          run_files.refused(job.workdir)  # It goes as the Trainer closes.
        raise
  except preemption.StoppedAtOnce as e:  # Before training began.
    raise e.error() from None
  except (tf.errors.OpError, OSError) as e:
    # A peer of a cluster died (or hung)? From the build's collectives too
    # (the config check, the restore). The disk under the workdir failed?
    lost = reports.stopped(e) or peers.lost(e) or disk.fault(e, job.workdir)
    if lost is None:
      raise
    raise lost from e
  return FitResult(
      trainer.model, summary, job.workdir, dict(trainer.history.history),
      os.path.join(job.workdir, trainer.parts.model_file)), trainer.parts.role


def _nothing_kept(trainer, error: BaseException) -> bool:
  """Whether nothing the run wrote is worth keeping, as it ends in `error`
  before its first checkpoint: a refusal (exit 2), or any failure before
  a step was trained (an unexpected error at the first step's trace, a
  stop request before training began). Its config.json and TensorBoard's
  events would then hold no step: a rerun would find them as another
  run's, and the events' start-up records beside its own. Once a step
  ran, the events keep its curves to the failure."""
  if trainer.parts.checkpoints.saved_at is not None:
    return False
  run = trainer.run_state
  return (getattr(error, "exit_code", None) == errors.EXIT_CONFIG_ERROR
          or isinstance(error, preemption.StoppedAtOnce)
          or run is None or run.step == 0)


def _translated_run(trainer) -> dict:
  """trainer.run(), a batch value the model cannot take, a cache file two
  pipelines write, slices that changed count within a call, ops XLA
  cannot compile, a call Keras' TensorFlow backend cannot trace
  (traced_limits.py) and a peer's refusal (reports.stopped), said as
  such."""
  try:
    return trainer.run()
  except ValueError as e:  # Found by the first step's trace.
    bad = traced_limits.fault(e, trainer.model)
    if bad is None:
      raise
    raise bad from e
  except tf.errors.OpError as e:
    on_tpu = isinstance(trainer.strategy, tf.distribute.TPUStrategy)
    bad = (reports.stopped(e) or batches.data_fault(e)
           or varying_slices.mismatch(e)
           or xla_limits.unsupported_ops(e, on_tpu))
    if bad is None:
      raise
    raise bad from e


def build(job: Job) -> loop.Trainer:
  """The whole run, in order, built but not trained (tools and tests that
  drive steps themselves use it too; use the Trainer in a `with`: it lets
  go of writers, scratch files, workdir and stop signals, and puts back
  what the run changed in the process). Nothing is written before every
  check has passed: a refused run removes its workdir (only the lock)."""
  config, workdir = job.config, job.workdir
  validate.workdir_named(workdir)  # (The command line's, before TF.)
  strategy = (job.strategy if isinstance(job.strategy, tf.distribute.Strategy)
              else strategies.make(job.strategy, config.runtime))
  reports.joined(tfconfig.from_env())  # (For a refusal's report.)
  strategies.own_collective_keys(strategy)
  role = strategies.Role.of(strategy, config.data.pipeline_per_replica)
  with contextlib.ExitStack() as undo:
    # SIGTERM's and Ctrl-C's handler to the run's last line, set once the
    # strategy exists (a multi-worker one sets TF's own as it starts).
    stop = undo.enter_context(preemption.StopRequest(
        strategy, role.workers > 1,
        config.train.log_every, keep=job.to_exit, before_training=True))
    if role.chief:
      # The lock before anything reads the workdir: the checkpoint another
      # run is writing there is not another model's, nor damaged.
      run_files.prepare(workdir)
      undo.callback(run_files.release, workdir, started=False)
    asked = config.to_dict()  # config.json's, before values are chosen.
    allreduce.check_same_config(strategy, asked)
    model_fn, dataset_fn = registry.resolve(config, *job.functions)
    resume = checkpoints.find_resume(workdir)  # Where the data resumes.
    kept = undo.enter_context(process_state.kept(config.runtime.seed))
    with same_model.shapes_said():
      model = checks.call_model_fn(model_fn, strategy, config.train.precision)
    same_model.refuse_different(strategy, model)  # (Each worker's own.)
    notes = model_checks.as_compiled(model, strategy, config.train)
    callbacks, note = user_callbacks.collect(
        config.train.callbacks, job.callbacks, model, config.train)
    feed = pipelines.Feed.from_config(config)
    train_ds, batch_spec, shards = _train_split(strategy, dataset_fn, feed,
                                                role, resume.step)
    eval_ds, eval_spec, eval_shards = _eval_split(strategy, dataset_fn,
                                                  feed, config, role)
    optimizers = compiled.optimizers_of(model)
    step = step_optimizers.StepTrace(model, strategy, optimizers, batch_spec)
    evaluates, said = model_checks.against_batches(step, dataset_fn,
                                                   eval_spec, config.train)
    model_file, weights_only = run_files.model_file(model)
    rate = lr.apply(optimizers, config.train)  # The batch-size rule.
    compiled.prepare_optimizers(step, kept)  # Each built in scope.
    saved, resumed = checkpoints.restored(workdir, model, optimizers, role,
                                          config.train.max_checkpoints, resume)
    on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
    parts = loop.Parts(role, model, train_ds, eval_ds, saved, rate,
                       optimizers, stop, kept, callbacks, evaluates,
                       batch_spec, model_file)
    notes += [shards, eval_shards, *said, weights_only, note,
              *settings.notes(config, on_tpu), resumed]
    trainer = loop.Trainer(
        parts, settings.Settings.from_config(config, on_tpu), workdir,
        asked, notes=[n for n in notes if n])
    undo.pop_all()  # The Trainer's close lets go of them.
  return trainer


def _train_split(strategy, dataset_fn, feed, role, start_step: int) -> tuple:
  """The train split's distributed dataset (resumed at `start_step`), its
  element spec, and the line said of its pipelines' first batches.

  Raises:
    UserError: pipelines that read the same stream (unsharded.py), on
      every worker together.
  """
  train_ds, batch_spec = pipelines.distribute(
      strategy, dataset_fn, "train", feed, start_step=start_step)
  return train_ds, batch_spec, unsharded.check(
      strategy, dataset_fn, role, feed.per_replica_pipelines)


def _eval_split(strategy, dataset_fn, feed, config, role) -> tuple:
  """The eval split's distributed dataset and element spec, or (None,
  None): dataset_fn('eval', ...) returned None, no eval split, as Keras'
  fit without validation_data; and the line said of its pipelines' first
  batches. Every worker must say the same (one with eval batches would
  run the eval's collectives alone): a collective under multi-worker.

  Raises:
    UserError: workers that disagree; eval.steps set without an eval split
      (it would be ignored); pipelines that read the same split
      (unsharded.py: each would evaluate every example), on every worker
      together.
  """
  eval_ds, eval_spec = pipelines.distribute(
      strategy, dataset_fn, "eval", feed, eval_steps=config.eval.steps)
  if role.workers > 1:
    replicas = strategy.num_replicas_in_sync
    have = int(allreduce.host_value_sum(strategy)(float(eval_ds is not None)))
    if have not in (0, replicas):
      raise leaving.refused_together(errors.UserError(
          f"dataset_fn('eval', ...) returned a dataset for {have} of the "
          f"{replicas} replicas and None (no eval split) for the others "
          f"(this worker: {'a dataset' if eval_ds is not None else 'None'});"
          " return None on every worker or an eval split on each."))
  if eval_ds is None and config.eval.steps:
    raise errors.UserError(
        f"eval.steps={config.eval.steps} but dataset_fn('eval', ...) "
        "returned None (no eval split), so it would be ignored; drop "
        "eval.steps (0), or return an eval split.")
  shards = "" if eval_ds is None else unsharded.check(  # (Every worker's.)
      strategy, dataset_fn, role, feed.per_replica_pipelines, "eval")
  return eval_ds, eval_spec, shards
