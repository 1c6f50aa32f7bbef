"""The model_fn side of the user contract, checked where it is crossed
(the dataset_fn side: batches.py; the model against its batches, and
called as Keras' steps call it: probe.py).

  model_fn() -> a Keras 3 model compiled by its author (optimizer, loss,
      metrics); dist_keras calls it inside `strategy.scope()`.

The built-in models and datasets are such pairs too (models.model_fn,
data.dataset_fn). Every check here raises UserError with one line naming
the bad value and the fix, before anything is written to the workdir.
"""
import inspect

import keras
import tensorflow as tf

from dist_keras import installation, origins, validate
from dist_keras.contract import fit_args, imports, traced_limits
from dist_keras.errors import UserError


def check_signature(fn, what: str, params: tuple = ()) -> None:
  """Raises UserError unless `fn` can be called as what(*params), as
  dist_keras calls it (model_fn(), dataset_fn(split, input_context))."""
  try:
    inspect.signature(fn).bind(*params)
  except ValueError:  # No signature to read (a builtin): call it.
    return
  except TypeError as e:
    raise UserError(
        f"{what} {getattr(fn, '__qualname__', fn)!r} cannot be called as "
        f"{what}({', '.join(params)}) ({e}); dist_keras calls it so: give "
        "its other parameters defaults or bind them (functools.partial)."
    ) from None


def call_model_fn(model_fn, strategy, precision: str) -> keras.Model:
  """`model_fn()` inside `strategy.scope()`, under train.precision; a
  model Keras' TensorFlow backend cannot trace is refused (traced_limits).

  A 16-bit train.precision is Keras' mixed-precision policy while model_fn
  builds (16-bit compute, float32 variables; compile wraps the optimizer in
  a LossScaleOptimizer for float16). float32, the default, leaves Keras'
  global policy as the user set it.
  """
  fit_args.refuse_built_model(model_fn)  # A module-level one, by name.
  check_signature(model_fn, "model_fn")
  previous = keras.config.dtype_policy()
  policy = validate.PRECISIONS[precision]
  if precision != "float32":
    keras.config.set_dtype_policy(policy)
  try:
    with strategy.scope(), origins.raised_in(
        f"model_fn {imports.name_of(model_fn)}"):
      model = model_fn()
  finally:
    if precision != "float32":  # A policy model_fn set stays, as for fit.
      keras.config.set_dtype_policy(previous)
  if not isinstance(model, keras.Model):
    raise UserError(f"model_fn returned a {type(model).__name__}, not a "
                    "keras.Model; return the compiled model it builds.")
  _check_policy(model, precision, policy)
  if not model.compiled or model.optimizer is None:
    raise UserError(
        f"model_fn returned model {model.name!r} uncompiled; call "
        "model.compile(optimizer=..., loss=..., metrics=[...]) inside "
        "model_fn, as for Keras' fit.")
  traced_limits.check(model, overrides(model, "train_step"))
  return model


def _check_policy(model, precision: str, policy: str) -> None:
  """A 16-bit train.precision that the model does not compute in (model_fn
  set its own Keras policy) would be said, logged and counted for MFU while
  another trains: refused."""
  built_under = getattr(model.dtype_policy, "name", policy)
  if precision != "float32" and built_under != policy:
    raise UserError(
        f"train.precision={precision} builds the model under Keras' "
        f"{policy!r} policy, but model {model.name!r} was built under "
        f"{built_under!r} (set in model_fn?); leave train.precision at "
        "float32 to train under your own policy, or drop it from model_fn.")


def overrides(model, method: str) -> bool:
  """Whether the model's class overrides keras.Model's `method`."""
  return getattr(type(model), method) is not getattr(keras.Model, method)


def stateful_batches(model, layers: list, replicas: int,
                     global_batch: int) -> None:
  """Raises UserError for a stateful RNN of `layers` (those inside the
  model) built for another batch size than each replica's: it keeps a
  state row per example of the batch it was built for (its Input's
  batch_shape), and Keras fails the first step that hands it another (one
  device's habit, the global batch, at N replicas)."""
  per_replica = global_batch // replicas
  for layer in _stateful(layers):
    built = tf.nest.flatten(layer.states)[0].shape[0]
    if built == per_replica:
      continue
    gets = (f"each of the {replicas} replicas gets batches of {per_replica}"
            f" (train.global_batch_size={global_batch} / {replicas})"
            if replicas > 1 else f"it gets batches of {per_replica} "
            "(train.global_batch_size)")
    raise UserError(
        f"layer {layer.name!r} of model {model.name!r} is a stateful RNN "
        f"built for batches of {built}, but {gets}; build it for the "
        "per-replica batch in model_fn: keras.Input(batch_shape=("
        "global_batch_size // tf.distribute.get_strategy()."
        "num_replicas_in_sync, ...)).")


def stateful_layers(model) -> list:
  """The model's stateful RNN layers whose states exist (None: built at
  step 1), in Keras' order of its layers: the same in every run of the
  model (the checkpoints number their states in it: rnn_states.py)."""
  return _stateful(installation.layers_in(model, include_self=False))


def _stateful(layers: list) -> list:
  """The stateful RNN layers of `layers` whose states exist."""
  return [layer for layer in layers
          if isinstance(layer, keras.layers.RNN) and layer.stateful
          and layer.states is not None]
