"""`dist_keras.fit`: train a compiled Keras model on tf.data input under
tf.distribute, with everything the built-in configs get.

  import dist_keras
  result = dist_keras.fit(model_fn, dataset_fn, workdir="runs/mine",
                          config={"train.steps": 500,
                                  "train.global_batch_size": 64})
  result.model, result.summary  # the trained model; summary.json

The command line (`python -m dist_keras.train`) runs this same function
with the names in its config, so a built-in and a user's model take the
same path: validate the config, pick the strategy, build in its scope,
distribute the input, train, evaluate, write the workdir.
"""
import copy
import dataclasses
import os
import re
from collections.abc import Mapping

import keras
import ml_collections
import tensorflow as tf

from dist_keras import contract, data as data_lib, errors, imports, loop
from dist_keras import lr as lr_lib, mfu as mfu_lib, profiler, registry
from dist_keras import strategy as strategy_lib, sync, workdir as workdir_lib
from dist_keras import configs
from dist_keras.configs import base
from dist_keras.errors import UserError


@dataclasses.dataclass
class FitResult:
  """What `fit` returns.

  Attributes:
    model: the trained Keras model (also saved as workdir/model.keras).
    summary: summary.json's fields: the strategy, replicas and steps, the
      final train and eval loss and every compiled metric (`train_NAME`,
      `eval_NAME`), throughput, the sync breakdown and MFU.
    workdir: where the run wrote its files.
  """
  model: keras.Model
  summary: dict
  workdir: str


def fit(model_fn, dataset_fn, *, workdir: str, config=None,
        strategy=None) -> FitResult:
  """Trains `model_fn`'s model on `dataset_fn`'s data, data-parallel.

  Args:
    model_fn: `() -> keras.Model`, compiled by you (optimizer, loss,
      metrics), called inside the strategy's scope; or a name: a built-in
      model (e.g. "sequence_classifier") or "PKG.MODULE:FN".
    dataset_fn: `(split, input_context) -> tf.data.Dataset` of that input
      pipeline's per-replica batches (x, y) or (x, y, sample_weight), split
      "train" (repeated, batches of exactly
      `input_context.get_per_replica_batch_size(global_batch_size)`) or
      "eval" (finite); or a name: a built-in dataset or "PKG.MODULE:FN".
    workdir: folder for checkpoints, TensorBoard events, config.json,
      summary.json and model.keras; a rerun with the same folder resumes.
    config: None (configs/base.py's defaults), a config (ConfigDict, e.g.
      `dist_keras.configs.load("lstm_longmem")`), or a dict of overrides of
      the defaults, {"train.steps": 500, ...}.
    strategy: None (the config's runtime.strategy: "auto" picks TPU, a
      TF_CONFIG cluster, or every local GPU / runtime.num_cpu_devices CPU
      devices), a runtime.strategy name, or a tf.distribute.Strategy.

  Returns:
    FitResult(model, summary, workdir).

  Raises:
    dist_keras.UserError: a bad setting, model or dataset (one line naming
      the value and the fix), before anything is written.
    dist_keras.errors.Diverged, Preempted, PeerLost: see errors.py.
  """
  with build(model_fn, dataset_fn, workdir=workdir, config=config,
             strategy=strategy) as trainer:
    talk = trainer.chief and trainer.config.log.progress
    if talk:
      print(f"dist_keras: {strategy_lib.display_name(trainer.strategy)} with "
            f"{trainer.replicas} replica(s); workdir {workdir}\n"
            f"TensorBoard: tensorboard --logdir {workdir}", flush=True)
    summary = trainer.run()
  if talk:
    print(f"{_done_line(summary)}; results in "
          f"{os.path.join(workdir, workdir_lib.SUMMARY_JSON)}\n"
          f"TensorBoard: tensorboard --logdir {workdir}", flush=True)
  return FitResult(trainer.model, summary, workdir)


def build(model_fn, dataset_fn, *, workdir: str, config=None,
          strategy=None) -> loop.Trainer:
  """What `fit` trains, built and checked but not trained: the Trainer
  (its model, optimizer and distributed datasets). For tools and tests
  that drive steps themselves; close() it (or use it in a `with`).

  Every check runs here, before anything is written or printed: the
  config's values, the strategy, then what model_fn and dataset_fn return.
  """
  config = _resolve_config(config)
  model_fn = _record_name(config.model, model_fn)
  dataset_fn = _record_name(config.data, dataset_fn)
  if isinstance(strategy, str):
    config.runtime.strategy = strategy
  model_fn, dataset_fn = registry.resolve(config, model_fn, dataset_fn)
  validate(config)
  if not isinstance(strategy, tf.distribute.Strategy):
    strategy = strategy_lib.get_strategy(config.runtime)
  return loop.Trainer(config, workdir, strategy, model_fn, dataset_fn)


def _done_line(summary: dict) -> str:
  """'done: 800 steps, eval accuracy 1.0000, loss 0.0012'."""
  metrics = [(k[len("eval_"):], v) for k, v in summary.items()
             if k.startswith("eval_") and k not in ("eval_loss",
                                                    "eval_examples")]
  text = ", ".join(f"{name} {value:.4f}" for name, value in
                   [*metrics, ("loss", summary["eval_loss"])])
  return f"done: {summary['steps']} steps, eval {text}"


def validate(config) -> None:
  """Every check of `config` that needs neither the strategy nor the
  model: runs before TensorFlow's runtime starts."""
  _check_train_cfg(config.train, config.eval)
  profiler.parse_profile_steps(config.log.profile_steps)
  errors.check_choice("train.precision", config.train.precision,
                      contract.PRECISIONS)
  errors.check_choice("runtime.allreduce_dtype",
                      config.runtime.allreduce_dtype, sync.ALLREDUCE_DTYPES)
  if config.data.threads < 0:
    raise UserError(f"data.threads={config.data.threads} must be >= 0 (0: "
                    "TensorFlow's shared pool).")
  strategy_lib.communication_options(config.runtime)  # Its checks.
  mfu_lib.check(config.log)
  lr_lib.check(config.train)


def _check_train_cfg(train_cfg, eval_cfg) -> None:
  for key in ("steps", "global_batch_size", "log_every", "checkpoint_every",
              "steps_per_loop"):
    if getattr(train_cfg, key) < 1:
      raise UserError(f"train.{key}={getattr(train_cfg, key)} must be >= 1.")
  for key in ("every", "steps"):
    if getattr(eval_cfg, key) < 0:
      raise UserError(f"eval.{key}={getattr(eval_cfg, key)} must be >= 0.")
  data_lib.per_replica_batch_size(train_cfg.global_batch_size, 1)


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
    try:
      if not re.fullmatch(r"\w+\.\w+", str(key)):
        raise KeyError(key)
      configs.override(defaults, [(key, value)])
    except (AttributeError, KeyError) as e:
      raise UserError(f"config key {key!r} names no setting (keys are "
                      "'section.key'); every key and its default is in "
                      "configs/base.py.") from e
    except (TypeError, ValueError) as e:
      raise UserError(f"config[{key!r}]={value!r}: "
                      f"{str(e).splitlines()[0]}") from e
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
