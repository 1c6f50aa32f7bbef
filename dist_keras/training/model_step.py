"""A model's own `train_step`, run on every replica as Keras' `fit` runs it.

GANs, contrastive and custom-loss models override `keras.Model.train_step`.
dist_keras runs that step inside `strategy.run`, unchanged, and makes the
optimizers the model updates all-reduce the gradients before applying them
(compiled.prepare_optimizers), so that clipping, gradient accumulation
and the loss-scale check see the global gradient and N replicas equal one
device. What the step does between reading its batch and returning its logs
is the model's own: the sync breakdown splits a timed step into input wait
and the model's step only (its all-reduce cannot be timed apart).
"""
import tensorflow as tf

from dist_keras.measure import stamps
from dist_keras.training import batch_read, replica_seeds, shared_slices
from dist_keras.training import steps

_MEAN = tf.distribute.ReduceOp.MEAN


def make_train_step(strategy, model, timed: bool = False, jit: bool = False,
                    logs_specs: list | None = None):
  """A tf.function `(distributed_iterator) -> dict` running the model's
  train_step on every replica: 'logs' (what the step returned, averaged
  over replicas as Keras' fit does) and 'finite' (every float log finite);
  with `timed`, 'step_start', 'inputs_ready' and per-replica 'stamps'
  [start, end] for breakdown.whole_step. `jit` compiles the model's
  train_step with XLA, as fit(jit_compile=True) compiles it (one device
  and TPUs: no merge_call to cross); the stamps around it stay outside
  (tf.timestamp has no XLA kernel). Each trace appends its 'logs' specs
  to `logs_specs` (own_steps' loop starts from them)."""
  clock = stamps.make_clock(strategy) if timed else None
  own_step = _own_step(model, jit)

  def replica_step(batch, step_start=None, host=None):
    del host  # Gathered by dist_keras' own step only.
    if timed:  # Once this replica's own part of the batch is here.
      start = stamps.stamp_after([batch, step_start], clock)
      batch = stamps.after_stamp(start, batch)
    logs = own_step(batch)
    if not timed:
      return logs, ()
    done = [*tf.nest.flatten(logs),
            *[tf.identity(v.value) for v in model.trainable_variables]]
    return logs, tf.stack([start, stamps.stamp_after(done, clock)])

  # Its optimizers' all-reduce (compiled.py) tells a position lookup's
  # slices from a per-example one's by the batch's size.
  replica_step = shared_slices.knowing_batch(replica_step)
  replica_step = replica_seeds.per_replica(replica_step)

  def one_step(iterator, host=None):
    out, batch, kwargs = batch_read.read_batch(strategy, iterator, timed,
                                               host)
    logs, stamped = strategy.run(replica_step, args=(batch,), kwargs=kwargs)
    out["logs"] = _mean_logs(strategy, logs)
    out["finite"] = all_finite(out["logs"])
    if logs_specs is not None:
      logs_specs.append(tf.nest.map_structure(tf.TensorSpec.from_tensor,
                                              out["logs"]))
    if timed:
      out["stamps"] = tf.stack(strategy.experimental_local_results(stamped))
    return out

  return steps.step_function(one_step)


def _own_step(model, jit: bool):
  """(batch) -> the model's train_step's flat logs; with `jit`, one XLA
  computation, as Keras' fit(jit_compile=True) compiles its
  one_step_on_data (the train_step alone)."""

  def own_step(batch):
    return flat_logs(model.train_step(batch))

  return tf.function(own_step, jit_compile=True) if jit else own_step


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
