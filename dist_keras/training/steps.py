"""The train step of a compiled model: the per-replica math (shared with
calibration) and the tf.functions the loop calls.

Every step runs the model's own compiled loss (`model.compute_loss`: the
loss with its reduction and sample weights, plus the model's regularisation
losses), feeds Keras' loss tracker and updates the compiled metrics
(`model.compute_metrics`), as Keras' own train_step does; only the gradient
all-reduce, the timing stamps and the host loop are dist_keras'. A model
that overrides train_step trains with its own (model_step.py).
"""
import dataclasses
import enum

import keras
import tensorflow as tf

from dist_keras.contract import model_calls
from dist_keras.measure import stamps
from dist_keras.training import (allreduce, batch_read, call_losses,
                                 keras_internals, metrics, replica_seeds,
                                 shared_slices, sparse_grads, trained_set)

_SUM = tf.distribute.ReduceOp.SUM


class Jit(enum.Enum):
  """What XLA compiles of a replica's step (train.jit_compile).

  COMPUTE: the forward and backward pass (where the FLOPs are); the
  all-reduce and update stay in the graph, because MirroredStrategy reaches
  its cross-device ops and variable updates through merge_call, which XLA
  cannot compile unless every device is a GPU ("tf.Variable on a different
  device", measured on logical CPUs). On one device (update_compiles) the
  untimed steps compile the whole replica step, update included, as Keras'
  fit(jit_compile=True) does. STEP: the WHOLE replica step, as a TPU
  compiles it: for strategies without merge_call and for tests that check a
  step is TPU-compilable; it cannot be timed (tf.timestamp has no XLA
  kernel).
  """
  OFF = "off"
  COMPUTE = "compute"
  STEP = "step"

  @classmethod
  def of(cls, value) -> "Jit":
    """train.jit_compile's False / True, or a Jit (or its value)."""
    if value is False:
      return cls.OFF
    if value is True:
      return cls.COMPUTE
    return cls(value.value if isinstance(value, cls) else value)


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How a train step is compiled and reduces (Settings.step_options).

  `allreduce_dtype` (bfloat16 | float16) casts the dense gradients for
  the all-reduce only: half the bytes on the wire, summed in that
  precision (an Embedding's slices are gathered uncompressed);
  `bytes_per_pack` packs it (allreduce.all_reduce_gradients).
  """
  jit: Jit = Jit.OFF
  allreduce_dtype: str = "float32"
  bytes_per_pack: int = 0


def forward_backward(model, optimizer, batch, update_metrics: bool = True,
                     variables=None):
  """Forward and backward pass on one replica: (loss, grads).

  Keras scales the compiled loss by 1 / replicas under tf.distribute (mean
  reductions are over the replica's own batch), so the SUM all-reduce of
  the replicas' gradients is the gradient of the global batch's loss,
  whatever the replica count. With a LossScaleOptimizer (float16) the
  gradients are of the loss times its scale, so small float16 gradients do
  not flush to zero; the returned loss is unscaled. The gradients are of
  `variables`, else of the model's trainable variables as it traces.
  """
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
  with tf.GradientTape() as tape, call_losses.as_one_device():
    y_pred = model_calls.forward(model, x, training=True)
    loss = model_calls.compute_loss(model, x, y, y_pred, sample_weight,
                              training=True)
    scaled = optimizer.scale_loss(loss)
  grads = tape.gradient(scaled, model.trainable_variables
                        if variables is None else variables)
  if update_metrics:
    metrics.update_loss_tracker(model, x, loss)
    model.compute_metrics(x, y, y_pred, sample_weight)
  return loss, grads


def make_compute_only(model, allreduce_dtype: str = "float32"):
  """The per-replica forward and backward pass of the train step, and no
  more (calibration: the step with free communication)."""
  optimizer = model.optimizer

  def replica_compute(batch):
    _, grads = forward_backward(model, optimizer, batch,
                                update_metrics=False)
    grads = allreduce.as_reduced(grads)  # As the train step does.
    # The variables as this trace reads them, as forward_backward did.
    tables = sparse_grads.table_form(optimizer, model.trainable_variables,
                                     grads, allreduce_dtype)
    grads = grads if tables is None else tables.local(grads)
    # Consume every gradient so none is pruned; per replica, no collective
    # (an IndexedSlices' values: summing it whole would densify it).
    return tf.add_n([tf.reduce_sum(getattr(g, "values", g))
                     for g in grads if g is not None])

  return replica_seeds.per_replica(
      shared_slices.knowing_batch(replica_compute))


def loss_scale_of(optimizer):
  """The dynamic loss scale variable of a LossScaleOptimizer, else None."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return optimizer.dynamic_scale
  return None


def update_compiles(strategy) -> bool:
  """Whether XLA can compile the optimizer's update inside a replica's step:
  on one device, where no merge_call reaches across devices."""
  return isinstance(strategy, tf.distribute.OneDeviceStrategy)


def compiles_whole(strategy, jit: Jit, timed: bool = False) -> bool:
  """Whether XLA compiles the whole replica step, update included:
  Jit.STEP's, and Jit.COMPUTE's untimed steps where the update compiles."""
  return jit is Jit.STEP or (jit is Jit.COMPUTE and not timed
                             and update_compiles(strategy))


def make_train_step(strategy, model, options: StepOptions = StepOptions(),
                    timed: bool = False, traced: list | None = None):
  """A tf.function `(distributed_iterator) -> dict` running one step of the
  compiled model on every replica.

  The dict holds 'loss' (the global batch's loss: the replicas' losses
  summed), 'finite_grads' (whether every all-reduced gradient value is
  finite) and 'skipped'; the compiled metrics are updated in place. With
  `timed`, the step is instrumented with in-graph stamps (stamps.STAMPS)
  and the dict also holds 'step_start', 'inputs_ready', per-replica
  'stamps' and this worker's replicas' 'job_rows' (stamps.durations_row;
  stamps.rows_gatherer makes them breakdown.split_step's job_durations);
  the timed function takes the worker's host figures too (`host`:
  batch_read.read_batch).
  Either way it holds 'sent_bytes' (allreduce.sent_bytes, the first
  replica's).

  The optimizer applies the gradients as reduced here (its own all-reduce
  is off: keras_internals.disable_optimizer_allreduce), so its clipping and
  gradient accumulation see the global gradient. With a LossScaleOptimizer
  (train.precision=float16) the update skips a step whose scaled gradients
  overflowed and halves the scale, as under Keras' fit; 'skipped' is then 1.
  With one replica in sync there is no all-reduce (the identity).
  The step updates the model's trainable variables as it traces, as
  Keras' train_step does, or those `traced` holds (trained_set.read).
  """
  jit = Jit.of(options.jit)
  if timed and jit is Jit.STEP:
    raise ValueError("timed steps cannot be XLA-compiled whole: tf.timestamp "
                     "has no XLA kernel; use jit_compile=True.")
  whole = compiles_whole(strategy, jit, timed)
  replica_step = _replica_step(strategy, model, options, timed,
                               jit is Jit.COMPUTE and not whole, traced)
  if whole:
    replica_step = tf.function(replica_step, jit_compile=True)
  return _distributed_step(strategy, replica_step, model.optimizer, timed)


def _replica_step(strategy, model, options: StepOptions, timed: bool,
                  compile_compute: bool, traced: list | None):
  """One replica's step: compute, all-reduce, update; with `timed`, the
  stamps between them."""
  optimizer = model.optimizer
  clock = stamps.make_clock(strategy) if timed else None
  # One replica sums with no one: its all-reduce is the identity, yet TF's
  # replica-context all_reduce still runs a merge_call and an IdentityN over
  # every gradient (up to 13% of the default LSTM's one-device step in one
  # A/B, nothing in another: docs/performance.md). Less work either way.
  reduces = strategy.num_replicas_in_sync > 1
  compute = _compute_fn(model, optimizer, compile_compute, traced)
  update = _update_fn(optimizer)

  def replica_step(batch, step_start=None, host=None):
    # Those compute takes the gradients of (trained_set.read, as it traces).
    variables = trained_set.read(model, traced)
    if timed:  # Once this replica's own part of the batch is here.
      start = stamps.stamp_after([batch, step_start], clock)
      batch = stamps.after_stamp(start, batch)
    loss, grads = compute(batch)
    # Under a global-norm clip an Embedding's slices are summed here, into
    # a table all-reduced dense, where it sends fewer bytes (sparse_grads).
    tables = sparse_grads.table_form(optimizer, variables, grads,
                                     options.allreduce_dtype)
    if tables is not None:
      grads = tables.local(grads)
    if timed:
      grads_ready = stamps.stamp_after(_parts(grads), clock)
      grads = stamps.after_stamp(grads_ready, grads)
    # Constants where the shapes are static: nothing to run per step.
    sent = allreduce.sent_bytes(grads, options.allreduce_dtype)
    if reduces:
      grads = allreduce.all_reduce_gradients(
          grads, options.allreduce_dtype, options.bytes_per_pack)
    if timed:
      reduced = stamps.stamp_after(_parts(grads), clock)
      grads = stamps.after_stamp(reduced, grads)
    finite = update(grads, variables, tables)
    if not timed:
      return loss, finite, (), (), sent
    # Reading every variable orders the last stamp after all their updates.
    end = stamps.stamp_after(
        [finite, *[tf.identity(v.value) for v in variables]], clock)
    job = stamps.durations_row(start, grads_ready, reduced, end,
                               step_start, host)
    return (loss, finite, tf.stack([start, grads_ready, reduced, end]),
            job, sent)

  # The batch's size tells a position lookup from a per-example one.
  return shared_slices.knowing_batch(replica_step)


def _parts(grads):
  """The tensors of `grads`, an IndexedSlices' values and indices among
  them: a stamp reads an element of each tensor, and reading an
  IndexedSlices as one would densify it (a scatter, timed as a phase)."""
  return tf.nest.flatten(grads, expand_composites=True)


def _compute_fn(model, optimizer, compile_compute: bool, traced):
  """(batch) -> (loss, grads): the replica's compute, the gradients of
  trained_set.read's variables. An Embedding's gradient stays an
  IndexedSlices to the optimizer, as under fit (allreduce.as_reduced)."""

  def compute(batch):
    loss, grads = forward_backward(
        model, optimizer, batch, variables=trained_set.read(model, traced))
    return loss, allreduce.as_reduced(grads)

  return tf.function(compute, jit_compile=True) if compile_compute else compute


def _update_fn(optimizer):
  """(reduced grads, their variables) -> whether the grads were all
  finite, once applied (the same on every replica: what tells the host the
  gradients diverged, or that a loss-scaled update skipped them). With no
  trainable variables nothing is applied, as in Keras' train_step."""

  def update(grads, variables, tables=None):
    if tables is not None:
      return tables.apply(optimizer, variables, grads)
    finite = allreduce.all_finite(grads)
    if variables:
      optimizer.apply_gradients(zip(grads, variables, strict=True))
    return finite

  return update


def _distributed_step(strategy, replica_step, optimizer, timed):
  """The tf.function that reads a batch and runs `replica_step` on every
  replica (make_train_step), with the stamps around the input read."""
  scale = loss_scale_of(optimizer)
  replica_step = replica_seeds.per_replica(replica_step)

  def one_step(iterator, host=None):
    out, batch, kwargs = batch_read.read_batch(strategy, iterator, timed,
                                               host)
    loss, finite, stamped, job, sent = strategy.run(
        replica_step, args=(batch,), kwargs=kwargs)
    out["loss"] = strategy.reduce(_SUM, loss, axis=None)
    out["finite_grads"] = strategy.experimental_local_results(finite)[0]
    # A loss-scaled update skips a step whose gradients overflowed.
    out["skipped"] = (tf.constant(0) if scale is None else tf.cast(
        tf.logical_not(out["finite_grads"]), tf.int32))
    if timed:
      out["stamps"] = tf.stack(strategy.experimental_local_results(stamped))
      # This worker's replicas' rows (stamps.rows_gatherer gathers all).
      out["job_rows"] = tf.concat(strategy.experimental_local_results(job), 0)
    out["sent_bytes"] = strategy.experimental_local_results(sent)[0]
    return out

  return step_function(one_step)


def step_function(one_step):
  """`one_step` as the loop's tf.function. No AutoGraph, as in Keras' own
  fit (its step functions are marked do_not_convert): nothing here branches
  on tensors, and converting the step cost ~1 s of tracing before the first
  step (LSTM default)."""
  return keras_internals.made_per_run(tf.function(
      tf.autograph.experimental.do_not_convert(one_step), autograph=False))
