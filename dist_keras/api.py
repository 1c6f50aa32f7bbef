"""`dist_keras.fit`: train a compiled Keras model on tf.data input under
tf.distribute, with everything the built-in configs get.

  import dist_keras
  result = dist_keras.fit(model_fn, dataset_fn, workdir="runs/mine",
                          config={"train.steps": 500,
                                  "train.global_batch_size": 64})
  result.model, result.summary  # the trained model; summary.json

The whole run is `assemble` below, top to bottom. The command line
(`python -m dist_keras.train`) runs the same `train` with the names in its
config, so a built-in and a user's model take the same path.
"""
import copy
import dataclasses
import os
import re
from collections.abc import Mapping

import keras
import ml_collections
import tensorflow as tf

from dist_keras import configs, validate
from dist_keras.configs import base
from dist_keras import registry
from dist_keras.contract import checks, imports
from dist_keras import data as data_lib
from dist_keras.distribute import input as input_lib
from dist_keras.distribute import strategy as strategy_lib
from dist_keras.errors import UserError
from dist_keras.measure import mfu
from dist_keras.training import callbacks as callbacks_lib
from dist_keras.training import checkpoints, loop, lr, model_step, report
from dist_keras.training import settings
from dist_keras.training import workdir as workdir_lib


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


def fit(model_fn, dataset_fn, *, workdir: str, config=None,
        strategy=None, callbacks=None) -> FitResult:
  """`dist_keras.fit` (its docstring says what each argument takes), once
  the TPU runtime's environment is set (dist_keras/__init__.py)."""
  config = _resolve_config(config)
  model_fn = _record_name(config.model, model_fn)
  dataset_fn = _record_name(config.data, dataset_fn)
  if isinstance(strategy, str):
    config.runtime.strategy = strategy
  validate.config(config)
  return train(config, workdir, model_fn, dataset_fn, strategy, callbacks)


def train(config, workdir: str, model_fn=None, dataset_fn=None,
          strategy=None, callbacks=None) -> FitResult:
  """`fit` for a config validate.config has checked (the command line checks
  it before TensorFlow starts): builds the run, trains, reports."""
  with build(config, workdir, model_fn, dataset_fn, strategy,
             callbacks) as trainer:
    talk = trainer.chief and config.log.progress
    if talk:
      print(f"dist_keras: {strategy_lib.display_name(trainer.strategy)} with "
            f"{trainer.replicas} replica(s) on "
            f"{mfu.device_kind(trainer.strategy)}; workdir {workdir}\n"
            f"TensorBoard: tensorboard --logdir {workdir}", flush=True)
    summary = trainer.run()
  if talk:
    print(f"{report.done_line(summary)}; results in "
          f"{os.path.join(workdir, workdir_lib.SUMMARY_JSON)}\n"
          f"TensorBoard: tensorboard --logdir {workdir}", flush=True)
  return FitResult(trainer.model, summary, workdir,
                   dict(trainer.history.history))


def build(config, workdir: str, model_fn=None, dataset_fn=None,
          strategy=None, callbacks=None) -> loop.Trainer:
  """The run of a validated `config`, built but not trained: the functions
  its names (or the given ones) stand for, under its strategy (or the
  given one), with the callbacks given or train.callbacks names. For tools
  and tests that drive steps themselves too; use the Trainer in a `with`
  (it closes its writers and scratch files)."""
  model_fn, dataset_fn = registry.resolve(config, model_fn, dataset_fn)
  callbacks = _callbacks(config.train, callbacks)
  if not isinstance(strategy, tf.distribute.Strategy):
    strategy = strategy_lib.get_strategy(config.runtime)
  return assemble(config, workdir, strategy, (model_fn, dataset_fn),
                  callbacks)


def assemble(config, workdir: str, strategy, functions,
             callbacks=()) -> loop.Trainer:
  """The whole run, in order: `functions` (model_fn, dataset_fn) under
  `strategy`. Everything is checked before anything is written: the
  Trainer's constructor makes the workdir, last."""
  model_fn, dataset_fn = functions
  start_step = checkpoints.latest_step(workdir)  # Where the data resumes.
  keras.utils.set_random_seed(config.runtime.seed)
  model = checks.call_model_fn(model_fn, strategy, config.train.precision)
  notes = _take_compiled_settings(model, strategy, config)
  data = {"global_batch_size": config.train.global_batch_size,
          "per_replica_pipelines": config.data.pipeline_per_replica}
  train_ds, batch_spec = input_lib.distribute(
      strategy, dataset_fn, "train", start_step=start_step, **data)
  eval_ds, _ = input_lib.distribute(strategy, dataset_fn, "eval",
                                    eval_steps=config.eval.steps, **data)
  checks.build_state(model, strategy, batch_spec)  # Loss and metrics state.
  rate = _prepare_optimizers(model, strategy, config.train)
  chief = strategy_lib.is_chief(strategy)
  saved = checkpoints.Checkpoints(
      workdir, model, list(model_step.optimizers_of(model).values()), chief,
      config.train.max_checkpoints)
  try:
    resumed = saved.restore(start_step)
    checkpoints.check_workers_agree(strategy, start_step,
                                    strategy_lib.num_workers(strategy), workdir)
  except Exception:
    saved.close()
    raise
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  parts = loop.Parts(strategy, model, train_ds, eval_ds, saved, rate,
                     callbacks)
  return loop.Trainer(parts, settings.Settings.from_config(config, on_tpu),
                      workdir, config.to_dict(),
                      notes=notes + _notes(config, on_tpu, resumed))


def _callbacks(train_cfg, given) -> list:
  """The callbacks passed to fit, or those train.callbacks names."""
  if train_cfg.callbacks and given is not None:
    raise UserError(
        f"callbacks were passed to fit and train.callbacks="
        f"{train_cfg.callbacks!r} names more; pass them one way.")
  if train_cfg.callbacks:
    factory = imports.load("train.callbacks", train_cfg.callbacks)
    given = factory()
  return callbacks_lib.check(given)


def _prepare_optimizers(model, strategy, train_cfg) -> lr.Rate:
  """The compiled optimizer with the batch-size rule applied; every
  optimizer built in scope (a replica function may not create slots), with
  the gradient all-reduce where the step needs it (model_step.py)."""
  rate = lr.apply(model.optimizer, train_cfg)
  model_step.prepare_optimizers(
      model, strategy, model_step.overrides(model, "train_step"))
  return rate


def _take_compiled_settings(model, strategy, config) -> list[str]:
  """What the model was compiled with that the loop honours or refuses:
  run_eagerly, steps_per_execution, jit_compile; returns notes for the
  run's start.

  Raises:
    UserError: run_eagerly=True, or XLA over a MirroredStrategy step the
      model writes itself.
  """
  notes, train = [], config.train
  if model.run_eagerly:
    raise UserError(
        f"model {model.name!r} was compiled with run_eagerly=True; "
        "dist_keras runs its steps as tf.functions on every replica, so "
        "compile it without run_eagerly (debug eagerly with model.fit on "
        "one device).")
  per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
  if per_execution > 1 and train.steps_per_loop not in (0, per_execution):
    raise UserError(
        f"model {model.name!r} was compiled with steps_per_execution="
        f"{per_execution} but train.steps_per_loop={train.steps_per_loop}; "
        "set one of them (or both alike).")
  if per_execution > 1:
    train.steps_per_loop = per_execution
    notes.append(f"steps per call: {per_execution} (the model's "
                 "steps_per_execution)")
  if model.jit_compile is True and not train.jit_compile:
    train.jit_compile = True
    notes.append("XLA: the model was compiled with jit_compile=True "
                 "(train.jit_compile=true)")
  if model_step.overrides(model, "train_step"):
    notes.append(_custom_step_note(model, strategy, train))
  if not model_step.evaluates(model):
    notes.append(f"no eval: {type(model).__name__} has no compiled loss and "
                 "no test_step of its own")
  return notes


def _custom_step_note(model, strategy, train) -> str:
  """The line a model's own train_step gets; refuses XLA where its update
  cannot compile."""
  if train.jit_compile and not isinstance(
      strategy, (tf.distribute.OneDeviceStrategy, tf.distribute.TPUStrategy)):
    raise UserError(
        f"train.jit_compile=true with {type(model).__name__}'s own "
        "train_step under a multi-device strategy: XLA cannot compile its "
        "optimizer's cross-device update (merge_call); use one device or a "
        "TPU, or set train.jit_compile=false.")
  return (f"{type(model).__name__}.train_step is the model's own: it runs "
          "as written on every replica (gradients all-reduced in its "
          "optimizer's apply); the sync breakdown splits its steps into "
          "input wait and model step only, and there is no calibration")


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
  if config.data.name == data_lib.SYNTHETIC:
    notes.append(data_lib.constant_batch.NOTE)
  return notes + ([resumed] if resumed else [])


def _resolve_config(config) -> ml_collections.ConfigDict:
  """A private copy of `config`, or the defaults with `config`'s overrides."""
  if config is None:
    return base.get_config()
  if isinstance(config, ml_collections.ConfigDict):
    return copy.deepcopy(config)
  if not isinstance(config, Mapping):
    raise UserError(f"config={type(config).__name__} is not a config; pass "
                    "a ConfigDict or a dict such as {'train.steps': 500}.")
  defaults = base.get_config()
  for key, value in config.items():
    if not re.fullmatch(r"\w+\.\w+", str(key)):
      raise UserError(f"config key {key!r} names no setting (keys are "
                      "'section.key'); every key and its default is in "
                      "configs/base.py.")
    configs.set_value(defaults, key, value, spelled=f"config[{key!r}]")
  return defaults


def _record_name(section, fn):
  """For a function: records its import path as section.name (config.json
  says what trained) and returns it; for a name: sets section.name."""
  if callable(fn):
    section.name = imports.name_of(fn)
    return fn
  if not isinstance(fn, str):
    raise UserError(f"expected a function or a name, got "
                    f"{type(fn).__name__}; see help(dist_keras.fit).")
  section.name = fn
  return None
