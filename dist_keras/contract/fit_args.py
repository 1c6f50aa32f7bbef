"""Keras' fit arguments, which dist_keras.fit does not take: each with what
does its work here (a config key, or the dataset_fn), so a Keras user's
habit is refused in one line that says where it went; class_weight= is
taken, as the config key train.class_weight. Nothing here imports
TensorFlow."""
import functools
import inspect
import sys

from dist_keras.contract import class_weights, imports
from dist_keras.errors import UserError

# What carries a batch's data in dist_keras, for Keras' fit(x, y) habit.
_FROM_DATASET_FN = ("dataset_fn, a function of (split, input_context) "
                    "returning that split's tf.data.Dataset of (x, y) batches")

# Keras' fit argument -> what sets it in dist_keras (configs/base.py keys).
KERAS_FIT_ARGS = {
    "x": _FROM_DATASET_FN,
    "y": _FROM_DATASET_FN,
    "epochs": "config={'train.steps': N} (the run's length in steps; an "
              "epoch is eval.every steps)",
    "steps_per_epoch": "config={'eval.every': N} (the steps between evals, "
                       "dist_keras' epoch)",
    "initial_epoch": "the same workdir again (a rerun resumes from its last "
                     "checkpoint)",
    "batch_size": "config={'train.global_batch_size': N} (dataset_fn batches"
                  " input_context.get_per_replica_batch_size(N))",
    "verbose": "config={'log.progress': False} (or True)",
    "shuffle": "ds.shuffle(buffer, seed=...) in dataset_fn",
    "sample_weight": "(x, y, sample_weight) batches from dataset_fn",
    "validation_data": "dataset_fn's 'eval' split",
    "validation_split": "dataset_fn's 'eval' split (split your data there)",
    "validation_batch_size": "dataset_fn's 'eval' split (its batches)",
    "validation_freq": "config={'eval.every': N} (in steps)",
    "validation_steps": "config={'eval.steps': N}",
}


def refusing_keras_args(fit):
  """`fit`, refusing Keras' fit arguments and a built model first, before
  anything starts TensorFlow's devices; its signature and help stay its
  own, and any other unknown keyword is Python's TypeError."""

  @functools.wraps(fit)
  def checked(*args, **kwargs):
    if len(args) > 2:  # fit(model, x, y): Python's TypeError says nothing.
      raise UserError(
          f"dist_keras.fit takes 2 positional arguments (model_fn, "
          f"dataset_fn), not {len(args)}; x and y come from "
          f"{_FROM_DATASET_FN}; see help(dist_keras.fit).")
    for name in kwargs:
      if name in KERAS_FIT_ARGS:
        raise UserError(
            f"dist_keras.fit takes no {name}= (Keras' fit does); use "
            f"{KERAS_FIT_ARGS[name]}; see help(dist_keras.fit).")
    refuse_built_model(args[0] if args else kwargs.get("model_fn"))
    if "class_weight" in kwargs:
      kwargs["config"] = _with_class_weight(kwargs.get("config"),
                                            kwargs.pop("class_weight"))
    return fit(*args, **kwargs)

  # What inspect, help() and IDEs show: fit's own, and the class_weight=
  # this wrapper takes for it.
  signature = inspect.signature(fit)
  checked.__signature__ = signature.replace(parameters=[
      *signature.parameters.values(),
      inspect.Parameter("class_weight", inspect.Parameter.KEYWORD_ONLY,
                        default=None)])
  return checked


def _with_class_weight(config, class_weight):
  """fit's `config` with Keras' class_weight= as train.class_weight (its
  weights by class index), the config key that carries it (the command
  line's, config.json's); None leaves it as it is. A config that sets the
  key too is refused: which one trains would be a guess."""
  if class_weight is None:
    return config
  weights = class_weights.as_weights(class_weight)
  if config is None or isinstance(config, dict):
    config = dict(config or {})
    if config.get(class_weights.KEY, ()):
      raise UserError(
          f"dist_keras.fit got class_weight= and config["
          f"{class_weights.KEY!r}] both; pass one.")
    return {**config, class_weights.KEY: weights}
  if not hasattr(config, "copy_and_resolve_references"):
    return config  # Not a config: fit says what config takes.
  config = config.copy_and_resolve_references()  # The caller's stays.
  if tuple(config.train.get("class_weight", ())):
    raise UserError(
        f"dist_keras.fit got class_weight= and a config whose "
        f"{class_weights.KEY} is set both; pass one.")
  with config.unlocked():
    config.train.class_weight = weights
  return config


def refuse_built_model(model_fn) -> None:
  """UserError for a keras.Model given as model_fn (Keras' fit(model, ...)
  habit). At fit's door, since building it started TensorFlow with its
  default devices, so the strategy's would fail first naming the devices;
  a model exists only where Keras is imported already."""
  keras = sys.modules.get("keras")
  if keras is not None and isinstance(model_fn, keras.Model):
    raise UserError(
        f"model_fn is a keras.Model ({model_fn.name!r}), not a function that"
        " builds it; pass a function that builds and compiles the model "
        "(def model_fn(): ...): dist_keras calls it inside the strategy's "
        "scope, so its variables are mirrored.")


def refuse_two_names(user_set: dict, config, functions: dict) -> None:
  """UserError for a model.name or data.name that fit's config sets (in
  `user_set`, configs.set_in's {key: how it was set}) while fit's argument
  for that side (`functions`: {"model_fn": ..., "dataset_fn": ...}) names
  another: the argument trains, and the key would be replaced silently."""
  for what, fn in functions.items():
    if not (isinstance(fn, str) or callable(fn)):
      continue  # fit says what it takes (a function or a name) itself.
    section = "model" if what == "model_fn" else "data"
    key, named = f"{section}.name", config[section].name
    given = fn if isinstance(fn, str) else imports.name_of(fn)
    if key in user_set and given != named:
      raise UserError(
          f"{user_set[key]} and {what}={given!r} both say what to train; "
          f"drop {key} from config (the {what} argument trains), or pass "
          f"{what}={named!r}.")
