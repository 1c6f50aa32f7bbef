"""A model's own `train_step`, run on every replica as Keras' `fit` runs it.

GANs, contrastive and custom-loss models override `keras.Model.train_step`.
dist_keras runs that step inside `strategy.run`, unchanged, and makes the
optimizers the model updates all-reduce the gradients before applying them
(keras_internals.reduce_in_apply), so that clipping, gradient accumulation
and the loss-scale check see the global gradient and N replicas equal one
device. What the step does between reading its batch and returning its logs
is the model's own: the sync breakdown splits a timed step into input wait
and the model's step only (its all-reduce cannot be timed apart).
"""
import keras
import tensorflow as tf

from dist_keras.errors import UserError
from dist_keras.measure import stamps
from dist_keras.training import allreduce, keras_internals
from dist_keras.training import steps

_MEAN = tf.distribute.ReduceOp.MEAN


def overrides(model, method: str) -> bool:
  """Whether the model's class overrides keras.Model's `method`."""
  return getattr(type(model), method) is not getattr(keras.Model, method)


def evaluates(model) -> bool:
  """Whether the model can be evaluated: Keras' test_step needs a compiled
  loss (a GAN compiles none), a model's own test_step knows."""
  return overrides(model, "test_step") or model.loss is not None


def optimizers_of(model) -> dict:
  """{attribute: optimizer} of every Keras optimizer the model holds: the
  compiled one and those a custom step uses (a GAN's two)."""
  found = {"optimizer": model.optimizer}
  for name, value in vars(model).items():
    if (isinstance(value, keras.optimizers.Optimizer)
        and not any(value is o for o in found.values())):
      found[name] = value
  return found


def prepare_optimizers(model, strategy) -> list:
  """Builds the compiled optimizer in scope (a replica function may not
  create its slots) and checks every other one is built; then routes the
  gradient all-reduce: in `apply` for a model's own step, else off (the
  compiled step reduces itself). Returns the model's optimizers.

  Raises:
    UserError: an optimizer attribute that is not built.
  """
  optimizers = optimizers_of(model)
  reduce_in_apply = overrides(model, "train_step")
  with strategy.scope():
    model.optimizer.build(model.trainable_variables)
  for name, optimizer in optimizers.items():
    if not optimizer.built:
      raise UserError(
          f"the model's {name} ({type(optimizer).__name__}) is not built, so "
          "its variables would be created inside a replica's step, where "
          f"TensorFlow cannot; call {name}.build(<the variables it updates>)"
          " in model_fn, after building the model.")
    if reduce_in_apply:
      keras_internals.reduce_in_apply(optimizer, _all_reduce)
    else:
      keras_internals.disable_optimizer_allreduce(optimizer)
    if strategy.num_replicas_in_sync > 1:
      keras_internals.update_without_merge_call(optimizer)
  return list(optimizers.values())


def _all_reduce(grads):
  if tf.distribute.get_replica_context().num_replicas_in_sync == 1:
    return grads
  return allreduce.all_reduce_gradients(grads)


def make_train_step(strategy, model, timed: bool = False, jit: bool = False):
  """A tf.function `(distributed_iterator) -> dict` running the model's
  train_step on every replica: 'logs' (what the step returned, averaged
  over replicas as Keras' fit does) and 'finite' (every float log finite);
  with `timed`, 'step_start', 'inputs_ready' and per-replica 'stamps'
  [start, end] for breakdown.whole_step. `jit` compiles the replica's
  step with XLA (one device and TPUs: no merge_call to cross)."""
  clock = stamps.make_clock(strategy) if timed else None

  def replica_step(batch, inputs_ready=None):
    if timed:
      start = stamps.stamp_after([batch, inputs_ready], clock)
      batch = stamps.after_stamp(start, batch)
    logs = flat_logs(model.train_step(batch))
    if not timed:
      return logs, ()
    done = [*tf.nest.flatten(logs),
            *[tf.identity(v.value) for v in model.trainable_variables]]
    return logs, tf.stack([start, stamps.stamp_after(done, clock)])

  if jit:
    replica_step = tf.function(replica_step, jit_compile=True)

  def one_step(iterator):
    out, batch, kwargs = steps.read_batch(strategy, iterator, timed)
    logs, stamped = strategy.run(replica_step, args=(batch,), kwargs=kwargs)
    out["logs"] = _mean_logs(strategy, logs)
    out["finite"] = all_finite(out["logs"])
    if timed:
      out["stamps"] = tf.stack(strategy.experimental_local_results(stamped))
    return out

  return steps.step_function(one_step)


def flat_logs(logs) -> dict:
  """A step's logs as one flat dict of float32 tensors (a nested dict, such
  as compile metrics' results, merged in, as Keras' callbacks get them)."""
  if not isinstance(logs, dict):
    return {"output": tf.cast(logs, tf.float32)}
  flat = {}
  for name, value in logs.items():
    if isinstance(value, dict):
      flat.update(flat_logs(value))
    else:
      flat[name] = tf.cast(value, tf.float32)
  return flat


def _mean_logs(strategy, logs) -> dict:
  """The step's logs averaged over the replicas (as Keras' fit does)."""
  return {name: strategy.reduce(_MEAN, value, axis=None)
          for name, value in logs.items()}


def all_finite(logs: dict):
  values = [tf.reduce_all(tf.math.is_finite(v)) for v in logs.values()]
  return tf.reduce_all(tf.stack(values)) if values else tf.constant(True)
