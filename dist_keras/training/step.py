"""What one step computes: the per-replica math (shared with calibration)
and the tf.functions the loop calls for train and eval steps.

Every step runs the model's own compiled loss (`model.compute_loss`: the
loss with its reduction and sample weights, plus the model's regularisation
losses) and updates its compiled metrics (`model.compute_metrics`), as
Keras' own train_step does; only the gradient all-reduce, the timing stamps
and the host loop are dist_keras'.
"""
import keras
import tensorflow as tf

from dist_keras.contract import checks
from dist_keras.measure import stamps
from dist_keras.training import allreduce

_SUM = tf.distribute.ReduceOp.SUM


def forward_backward(model, optimizer, batch, update_metrics: bool = True):
  """Forward and backward pass on one replica: (loss, grads).

  Keras scales the compiled loss by 1 / replicas under tf.distribute (mean
  reductions are over the replica's own batch), so the SUM all-reduce of
  the replicas' gradients is the gradient of the global batch's loss,
  whatever the replica count. With a LossScaleOptimizer (float16) the
  gradients are of the loss times its scale, so small float16 gradients do
  not flush to zero; the returned loss is unscaled.
  """
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
  with tf.GradientTape() as tape:
    y_pred = model(x, training=True)
    loss = checks.compute_loss(model, x, y, y_pred, sample_weight,
                                 training=True)
    scaled = optimizer.scale_loss(loss)
  grads = tape.gradient(scaled, model.trainable_variables)
  if update_metrics:
    model.compute_metrics(x, y, y_pred, sample_weight)
  return loss, grads


def make_compute_only(model, optimizer):
  """The per-replica forward and backward pass of the train step, and no
  more (calibration: the step with free communication)."""

  def replica_compute(batch):
    _, grads = forward_backward(model, optimizer, batch,
                                update_metrics=False)
    grads = allreduce.dense_gradients(grads)  # As the train step does.
    # Consume every gradient so none is pruned; per replica, no collective.
    return tf.add_n([tf.reduce_sum(g) for g in grads if g is not None])

  return replica_compute


def loss_scale_of(optimizer):
  """The dynamic loss scale variable of a LossScaleOptimizer, else None."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return optimizer.dynamic_scale
  return None


def update_compiles(strategy) -> bool:
  """Whether XLA can compile the optimizer's update inside a replica's step:
  on one device, where no merge_call reaches across devices."""
  return isinstance(strategy, tf.distribute.OneDeviceStrategy)


def make_train_step(strategy, model, optimizer, timed: bool = False,
                    jit_compile: bool = False,
                    allreduce_dtype: str = "float32", bytes_per_pack: int = 0):
  """A tf.function running one step on every replica.

  Returns a function `(distributed_iterator) -> dict` with 'loss' (the
  global batch's loss: the replicas' losses summed) and 'grad_norm', the
  global norm of the all-reduced (unscaled) gradient; the compiled metrics
  are updated in place. With `timed`, the step is instrumented with in-graph
  stamps (stamps.STAMPS) and the dict also holds 'step_start',
  'inputs_ready', per-replica 'stamps' and every replica's
  'collective_waits' for breakdown_lib.breakdown.

  `jit_compile=True` compiles each replica's forward and backward pass (its
  compute: where the FLOPs are) with XLA; the all-reduce and the update stay
  in the graph, because MirroredStrategy reaches its cross-device ops and
  its variables' updates through merge_call, which XLA cannot compile
  unless every device is a GPU ("tf.Variable on a different device",
  measured on logical CPUs). On one device (update_compiles) the untimed
  steps compile the whole replica step instead, update included, as Keras'
  fit(jit_compile=True) does. `jit_compile="step"` compiles the WHOLE replica
  step (forward, backward, all-reduce, update), as a TPU compiles it: for
  strategies without merge_call (one device, TPU, all-GPU Mirrored) and for
  tests that check a step is TPU-compilable; it cannot be timed
  (tf.timestamp has no XLA kernel).

  The optimizer applies the gradients as reduced here (its own per-replica
  all-reduce is off, allreduce.disable_optimizer_allreduce), so its clipping
  (clipnorm, global_clipnorm) sees the global gradient. With a
  LossScaleOptimizer (train.precision=float16) the gradients are scaled
  until the update, which skips a step whose scaled gradients overflowed
  (and halves the scale); 'skipped' is then 1 and the step still counts
  (the optimizer's step counter advances), so the step count stays the
  number of batches read, which exact resume relies on.
  `allreduce_dtype` (bfloat16 | float16) casts the gradients for the
  all-reduce only: half the bytes on the wire, summed in that precision;
  `bytes_per_pack` packs it (allreduce.all_reduce_gradients). With one
  replica in sync there is no all-reduce (it would be the identity), so
  neither applies.
  """
  variables = model.trainable_variables
  clock = stamps.make_clock(strategy) if timed else None
  # One replica sums with no one: its all-reduce is the identity, yet TF's
  # replica-context all_reduce still runs a merge_call and an IdentityN over
  # every gradient (up to 13% of the default LSTM's one-device step in one
  # A/B, nothing in another: docs/performance.md). Less work either way.
  reduces = strategy.num_replicas_in_sync > 1
  scale = loss_scale_of(optimizer)

  def compute(batch):
    loss, grads = forward_backward(model, optimizer, batch)
    return loss, allreduce.dense_gradients(grads)  # Compute, not all-reduce.

  def update(grads):
    norm = tf.linalg.global_norm(grads)  # Same on every replica.
    optimizer.apply_gradients(zip(grads, variables))
    # The global norm, after the reduction: what tells the host that the
    # gradients became non-finite.
    return norm if scale is None else norm / scale

  if jit_compile not in (False, True, "step"):
    raise ValueError(f"jit_compile={jit_compile!r}: False, True or 'step'.")
  if timed and jit_compile == "step":
    raise ValueError("timed steps cannot be XLA-compiled whole: tf.timestamp "
                     "has no XLA kernel; use jit_compile=True.")
  whole = jit_compile == "step" or (
      jit_compile is True and not timed and update_compiles(strategy))
  compute_fn = (tf.function(compute, jit_compile=True)
                if jit_compile is True and not whole else compute)

  def replica_step(batch, inputs_ready=None):
    if timed:
      start = stamps.stamp_after([batch, inputs_ready], clock)
      batch = stamps.after_stamp(start, batch)
    loss, grads = compute_fn(batch)
    if timed:
      grads_ready = stamps.stamp_after(grads, clock)
      grads = stamps.after_stamp(grads_ready, grads)
    if reduces:
      grads = allreduce.all_reduce_gradients(grads, allreduce_dtype,
                                             bytes_per_pack)
    if timed:
      reduced = stamps.stamp_after(grads, clock)
      grads = stamps.after_stamp(reduced, grads)
    grad_norm = update(grads)
    if not timed:
      return loss, grad_norm, (), ()
    # Reading every variable orders the last stamp after all their updates.
    end = stamps.stamp_after([tf.identity(v.value) for v in variables], clock)
    waits = stamps.gather_collective_wait(grads_ready, reduced, end)
    return (loss, grad_norm, tf.stack([start, grads_ready, reduced, end]),
            waits)

  if whole:
    replica_step = tf.function(replica_step, jit_compile=True)

  return _distributed_step(strategy, replica_step, optimizer, scale, timed)


def _distributed_step(strategy, replica_step, optimizer, scale, timed):
  """The tf.function that reads a batch and runs `replica_step` on every
  replica (make_train_step), with the stamps around the input read."""

  def one_step(iterator):
    out = {}
    if timed:
      out["step_start"] = tf.timestamp()
      with tf.control_dependencies([out["step_start"]]):
        batch = next(iterator)
      out["inputs_ready"] = stamps.stamp_after(
          [strategy.experimental_local_results(t)
           for t in tf.nest.flatten(batch)])
      # Replicas start after this stamp; otherwise, with every core busy
      # computing, TensorFlow may run it late and inflate the input wait.
      kwargs = {"inputs_ready": out["inputs_ready"]}
    else:
      batch, kwargs = next(iterator), {}
    loss, grad_norm, stamped, waits = strategy.run(
        replica_step, args=(batch,), kwargs=kwargs)
    out["loss"] = strategy.reduce(_SUM, loss, axis=None)
    out["grad_norm"] = strategy.experimental_local_results(grad_norm)[0]
    out["skipped"] = _count_skipped_step(optimizer, scale, out["grad_norm"])
    if timed:
      out["stamps"] = tf.stack(strategy.experimental_local_results(stamped))
      # The same gathered vector on every replica: take the first.
      out["collective_waits"] = strategy.experimental_local_results(waits)[0]
    return out

  # No AutoGraph, as in Keras' own fit (its step functions are marked
  # do_not_convert): nothing here branches on tensors, and converting the
  # step cost ~1 s of tracing before the first step (LSTM default).
  return tf.function(tf.autograph.experimental.do_not_convert(one_step),
                     autograph=False)


def _count_skipped_step(optimizer, scale, grad_norm):
  """1 if the loss-scaled update skipped this step, else 0 (int32).

  Keras' LossScaleOptimizer does not advance the step counter on a skipped
  step; advancing it here (cross-replica context, after the update) keeps
  "steps" equal to "batches read". Without loss scaling nothing is skipped.
  """
  if scale is None:
    return tf.constant(0)
  skipped = tf.cast(tf.logical_not(tf.math.is_finite(grad_norm)), tf.int32)
  optimizer.iterations.assign_add(tf.cast(skipped, optimizer.iterations.dtype))
  return skipped


def make_multi_step(strategy, model, optimizer, **step_options):
  """A tf.function `(iterator, n) -> dict` running up to n plain steps.

  One call per n steps instead of per step: host round trips dominate on
  TPUs (and cost ~1 ms of dispatch per step here). Returns the summed 'loss'
  and 'skipped', the last 'grad_norm' and 'steps' run; it stops early after
  a step with a non-finite loss or gradient norm (unless loss scaling
  skipped that step), so the host sees that step before anything is saved.
  `step_options` are make_train_step's (not `timed`).
  """
  step = make_train_step(strategy, model, optimizer, **step_options)
  one_step = step.python_function

  # An explicit while loop, not AutoGraph: a conversion that fails (the
  # source unreadable, or changed on disk under a running process) falls
  # back to Python silently.
  @tf.function(autograph=False)
  def train_steps(iterator, n):
    def keep_going(done, loss, norm, skipped, diverged):
      del loss, norm, skipped
      return tf.logical_and(done < n, tf.logical_not(diverged))

    def run_one(done, loss, norm, skipped, diverged):
      del norm, diverged
      out = one_step(iterator)
      norm = out["grad_norm"]
      diverged = tf.logical_or(
          tf.logical_not(tf.math.is_finite(out["loss"])),
          tf.logical_and(tf.logical_not(tf.math.is_finite(norm)),
                         tf.equal(out["skipped"], 0)))
      return (done + 1, loss + out["loss"], norm, skipped + out["skipped"],
              diverged)

    done, loss, norm, skipped, _ = tf.while_loop(
        keep_going, run_one, (tf.constant(0), tf.constant(0.0),
                              tf.constant(0.0), tf.constant(0),
                              tf.constant(False)))
    return {"loss": loss, "grad_norm": norm, "steps": done,
            "skipped": skipped}

  return train_steps


def make_eval_pass(strategy, model):
  """A tf.function `(distributed_dataset) -> [loss_sum, examples]` over one
  pass of a finite eval dataset; it updates the compiled metrics.

  The loss is Keras' evaluate() loss: each batch's compiled loss (unscaled
  from Keras' 1 / replicas) weighted by its example count. Replicas that
  run out of data before the others get empty batches from TensorFlow,
  which count nowhere, so every example counts exactly once whatever the
  replica and worker count.
  """
  replicas = strategy.num_replicas_in_sync

  def batch_totals(x, y, sample_weight, examples):
    y_pred = model(x, training=False)
    loss = checks.compute_loss(model, x, y, y_pred, sample_weight,
                                 training=False)
    model.compute_metrics(x, y, y_pred, sample_weight)
    return tf.stack([tf.cast(loss, tf.float32) * replicas * examples,
                     examples])

  def replica_step(batch):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    examples = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
    # An empty batch is not run through the model: TF 2.21's oneDNN fused
    # Conv2D+Relu fails on one ("input depth must be evenly divisible by
    # filter depth") on AVX-512 hosts, and it counts nowhere anyway.
    return tf.cond(examples > 0,
                   lambda: batch_totals(x, y, sample_weight, examples),
                   lambda: tf.zeros([2]))

  def add_batch(totals, batch):
    return totals + strategy.reduce(
        _SUM, strategy.run(replica_step, args=(batch,)), axis=None)

  @tf.function(autograph=False)
  def eval_pass(dataset):
    return _reduce(dataset, tf.zeros([2]), add_batch)

  return eval_pass


def _reduce(dataset, initial_state, reduce_fn):
  """`reduce_fn` over every element, in a while loop over the dataset's
  iterator: a distributed dataset's own reduce (what AutoGraph makes of a
  `for` over it, without AutoGraph: see make_multi_step), written out so a
  plain tf.data.Dataset (input.reads_on_host) runs the step the same way:
  tf.data.Dataset.reduce would run the model inside tf.data's runtime."""
  iterator = iter(dataset)

  def body(optional, state):
    state = reduce_fn(state, optional.get_value())
    return iterator.get_next_as_optional(), state

  _, state = tf.while_loop(lambda optional, _: optional.has_value(), body,
                           [iterator.get_next_as_optional(), initial_state],
                           parallel_iterations=1)
  return state


def make_metrics_reader(model):
  """A tf.function `() -> {name: value}` of the compiled metrics, read in
  cross-replica context: each metric's state is summed over every replica
  and worker (Keras keeps it in SUM-aggregated on-read variables), so the
  value is the job's. The loss is the loop's own (Keras' loss tracker is
  not updated), so it is left out. Under MultiWorkerMirroredStrategy the
  read is a collective: every worker must call it at the same points."""

  @tf.function(autograph=False)
  def read():
    return {name: tf.cast(value, tf.float32)
            for name, value in model.get_metrics_result().items()
            if name != "loss"}

  return read


def evaluate(eval_pass, read_metrics, model, dataset) -> dict:
  """One eval pass: {'loss', every compiled metric, 'examples'}."""
  model.reset_metrics()
  loss_sum, examples = eval_pass(dataset).numpy()
  result = {name: float(v) for name, v in read_metrics().items()}
  result["loss"] = float(loss_sum / max(examples, 1.0))
  result["examples"] = int(round(examples))
  return result
