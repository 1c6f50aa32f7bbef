"""Built-in models, each a `model_fn` like a user's: build, then compile.

`model_fn(config, input_spec)` returns the `model_fn()` of
`config.model.name`: it builds the layers (`build(model_cfg, input_spec)`:
no strategy, no compile, no globals) and compiles them as a user would —
the optimizer train.optimizer names at train.learning_rate, clipping the
global gradient norm at train.global_clipnorm, sparse cross-entropy from
logits and accuracy. The training loop sees nothing else: the built-ins
reach it through the same contract as users' models.
"""
import importlib

import keras

from dist_keras import catalog, validate


def _module(model_cfg):
  """The module of model.name (catalog.MODELS; the doors check the name)."""
  return importlib.import_module(
      f"dist_keras.models.{catalog.MODELS[model_cfg.name].module}")


def check(model_cfg, input_spec) -> None:
  """Raises UserError if `model_cfg` cannot be built for `input_spec`."""
  _module(model_cfg).check(model_cfg, input_spec)


def build(model_cfg, input_spec) -> keras.Model:
  """Builds the model `model_cfg.name` for inputs described by `input_spec`."""
  check(model_cfg, input_spec)
  return _module(model_cfg).build(model_cfg, input_spec)


def make_optimizer(train_cfg) -> keras.optimizers.Optimizer:
  """The optimizer `train_cfg.optimizer` names, at `train_cfg.learning_rate`.

  Its global-norm clipping sees the all-reduced gradient: dist_keras reduces
  gradients before `apply_gradients` (training/allreduce.py), where Keras would clip each
  replica's own. The batch-size rule (train.lr_scaling) is applied later,
  to this optimizer as to a user's (training/lr.py).
  """
  kwargs = {"learning_rate": train_cfg.learning_rate,
            "global_clipnorm": train_cfg.global_clipnorm or None}
  if train_cfg.optimizer in validate.MOMENTUM_OPTIMIZERS:
    kwargs["momentum"] = train_cfg.momentum
  return make(train_cfg.optimizer, **kwargs)


def make(optimizer: str, **kwargs) -> keras.optimizers.Optimizer:
  """The Keras optimizer validate.OPTIMIZERS names, by Keras' own name."""
  return keras.optimizers.get({"class_name": optimizer, "config": kwargs})


def model_fn(config, input_spec):
  """The `model_fn()` of built-in model `config.model.name`: the model,
  compiled with the config's optimizer, for inputs `input_spec`."""
  check(config.model, input_spec)

  def build_and_compile() -> keras.Model:
    model = _module(config.model).build(config.model, input_spec)
    model.compile(
        optimizer=make_optimizer(config.train),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model

  return build_and_compile
