"""The compiled model as the loop takes it, a user's or a built-in: what it
was compiled with that the loop honours or refuses (run_eagerly,
steps_per_execution, jit_compile; XLA's own limits: contract/xla_limits.py,
checked after, in model_checks.py), which of Keras' steps it overrides
(train_step, test_step: model_step.py runs an own train_step), and its
optimizers, built in scope with the gradient all-reduce where its step
needs it. Keras' fit is the reference meaning of each (docs/own_models.md
has the table)."""
import collections.abc

import keras
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract.checks import overrides  # (loop.py reads it here.)
from dist_keras.errors import UserError
from dist_keras.training import allreduce, keras_internals, step_optimizers


def take(model, layers: list, strategy, train_cfg) -> list[str]:
  """Applies what `fit` would honour to `train_cfg` (steps per call, XLA);
  returns the notes the run says before its first step of what the model
  was compiled with. `layers`: those inside the model
  (installation.layers_in).

  Raises:
    UserError: run_eagerly=True, or a steps_per_execution that contradicts
      train.steps_per_loop.
  """
  if model.run_eagerly:
    raise UserError(
        f"model {model.name!r} was compiled with run_eagerly=True; "
        "dist_keras runs its steps as tf.functions on every replica, so "
        "compile it without run_eagerly (debug eagerly with model.fit on "
        "one device).")
  replicas = strategy.num_replicas_in_sync
  notes = [_steps_per_execution(model, train_cfg),
           _per_replica_denominator(model, replicas),
           _per_replica_batch_norm(layers, replicas)]
  if model.jit_compile is True and not train_cfg.jit_compile:
    train_cfg.jit_compile = True
    notes.append("XLA: the model was compiled with jit_compile=True "
                 "(train.jit_compile=true)")
  return [note for note in notes if note]


def _steps_per_execution(model, train_cfg) -> str | None:
  """The model's steps_per_execution as steps per call, as fit runs them."""
  per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
  if per_execution == 1:
    return None
  if train_cfg.steps_per_loop not in (0, per_execution):
    raise UserError(
        f"model {model.name!r} was compiled with steps_per_execution="
        f"{per_execution} but train.steps_per_loop="
        f"{train_cfg.steps_per_loop}; set one of them (or both alike).")
  train_cfg.steps_per_loop = per_execution
  return (f"steps per call: {per_execution} (the model's "
          "steps_per_execution)")


def _per_replica_denominator(model, replicas: int) -> str | None:
  """The line a loss that Keras divides by each replica's own count gets
  (an output mask's unmasked entries; the sample weights' sum under
  reduction='mean_with_sample_weight'): N replicas train what one device
  trains only when every replica's count is equal."""
  masked = any(getattr(t, "_keras_mask", None) is not None
               for t in getattr(model, "outputs", None) or [])
  weighted = any(getattr(loss, "reduction", None) == "mean_with_sample_weight"
                 for loss in tf.nest.flatten(model.loss))
  if replicas <= 1 or not (masked or weighted):
    return None
  count = ("unmasked outputs (the output has a mask)" if masked
           else "sample weights (reduction='mean_with_sample_weight')")
  return (f"the compiled loss is divided by each replica's own sum of "
          f"{count}, as under fit with MirroredStrategy: {replicas} replicas"
          " train what one device trains only where every replica's sum is "
          "the same (" + installation.see_docs(
              "own_models.md", "the table of Keras features",
              "Python API: your own model and data") + ")")


def _per_replica_batch_norm(layers: list, replicas: int) -> str | None:
  """The line BatchNormalization layers (of `layers`) that normalise by
  each replica's own batch get (Keras' default, synchronized=False). A
  frozen one (trainable=False: Keras then normalises by its moving
  statistics, as in inference) is the same on every replica: not said."""
  own = [layer.name for layer in layers
         if isinstance(layer, keras.layers.BatchNormalization)
         and not layer.synchronized and layer.trainable]
  if replicas <= 1 or not own:
    return None
  return (f"{len(own)} BatchNormalization layer(s) ({own[0]}, ...) normalise"
          f" by each replica's own batch of 1/{replicas} of the examples, as "
          "under fit with MirroredStrategy; BatchNormalization(synchronized="
          "True) uses the global batch's statistics, as one device does")


def keeps_ema(optimizer) -> bool:
  """Whether `optimizer` keeps moving averages of the weights (use_ema),
  through a LossScaleOptimizer's wrapper or in any of a MultiOptimizer's."""
  optimizer = keras_internals.inner(optimizer)
  return any(getattr(o, "use_ema", False)
             for o in getattr(optimizer, "optimizers", [optimizer]))


def optimizers_of(model) -> dict:
  """{name: optimizer} of every Keras optimizer the model holds, each once,
  named as the model reaches it: `optimizer`, the compiled one; then those
  a custom step uses (a GAN's two), as attributes (`d_optimizer`), items of
  a list, tuple or dict attribute (`opts[0]`, `opts['d']`), or held by a
  nested layer or sub-model (`discriminator.optimizer`, compiled itself).
  Keras tracks the layers, variables and metrics a layer is given, not its
  optimizers, so its attributes are walked: a layer's own optimizers
  first, in order, then its public attributes, then its private ones."""
  found = {"optimizer": model.optimizer}
  seen = {id(model.optimizer), id(keras_internals.inner(model.optimizer))}
  _walk(model, "", found, seen)
  return found


def _walk(value, name: str, found: dict, seen: set) -> None:
  """Adds the optimizers `value` holds to `found` ({name: optimizer}),
  named from `name` on; `seen`: the ids of what was walked or found."""
  if isinstance(value, keras.optimizers.Optimizer):
    if id(value) not in seen:
      found[name] = value
      # A LossScaleOptimizer's inner one steps through it only.
      seen.update((id(value), id(keras_internals.inner(value))))
    return
  if id(value) in seen:
    return
  if isinstance(value, keras.layers.Layer):
    seen.add(id(value))
    attributes = vars(value)
    for key in sorted(attributes, key=lambda k: (
        not isinstance(attributes[k], keras.optimizers.Optimizer),
        k.startswith("_"))):
      _walk(attributes[key], f"{name}.{key}" if name else key, found, seen)
  elif isinstance(value, collections.abc.Mapping):
    seen.add(id(value))
    for key, item in value.items():
      _walk(item, f"{name}[{key!r}]", found, seen)
  elif isinstance(value, (list, tuple)):
    seen.add(id(value))
    for i, item in enumerate(value):
      _walk(item, f"{name}[{i}]", found, seen)


def prepare_optimizers(step: step_optimizers.StepTrace, kept):
  """Builds the compiled optimizer in scope (a replica function may not
  create its slots), and every other one of `step.optimizers` the model's
  train_step applies, on the variables it hands it, traced on a batch of
  `step.batch_spec` (as its first apply would under fit:
  step_optimizers.py); then routes the gradient all-reduce: in `apply`
  for a model's own step, else off (the compiled step reduces itself).
  `kept` (an ExitStack, process_state.kept) puts it back as the run ends.

  Raises:
    UserError: an optimizer attribute that is not built and the trace
      cannot say exactly what to build it on.
  """
  model, strategy, optimizers = step.model, step.strategy, step.optimizers
  reduce_in_apply = overrides(model, "train_step")
  with strategy.scope():
    model.optimizer.build(model.trainable_variables)
  unbuilt = step_optimizers.build_applied(step)
  if unbuilt:
    name, why = next(iter(unbuilt.items()))
    raise UserError(
        f"the model's {name} ({type(optimizers[name]).__name__}) is not "
        f"built and cannot be built before training: {why}; its variables "
        "would be created inside a replica's step, where TensorFlow cannot,"
        f" so call {name}.build(<the variables it updates>) in model_fn, "
        "after building the model.")
  kept.callback(keras_internals.hooks_put_back(optimizers.values()))
  for optimizer in optimizers.values():
    if reduce_in_apply:
      keras_internals.reduce_in_apply(optimizer, _all_reduce)
    else:
      keras_internals.disable_optimizer_allreduce(optimizer)
    if strategy.num_replicas_in_sync > 1:
      keras_internals.update_without_merge_call(optimizer)


def _all_reduce(grads):
  """A replica's gradients summed over the replicas (an own step's
  optimizers apply them as one device would)."""
  if tf.distribute.get_replica_context().num_replicas_in_sync == 1:
    return grads
  return allreduce.all_reduce_gradients(grads)
