"""What one step computes: the per-replica math (shared with calibration)
and the tf.functions the loop calls for train and eval steps."""
import keras
import tensorflow as tf

from dist_keras import sync

_SUM = tf.distribute.ReduceOp.SUM


def sparse_ce(labels, logits):
  """Per-example cross-entropy from logits."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


def per_example_loss(labels, logits):
  """Cross-entropy per example; for per-token labels, its mean over tokens.

  Averaging over the non-batch axes before the division by the global batch
  makes a language model's loss the mean per token (so exp(loss) is its
  perplexity), on the same scale whatever seq_len; classifiers are unchanged.
  """
  loss = sparse_ce(labels, logits)
  if loss.shape.rank > 1:
    loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
  return loss


def num_correct(labels, logits):
  """How many argmax predictions equal the labels (float32).

  Elementwise: for per-token labels it counts correct tokens.
  """
  return tf.reduce_sum(correct_per_example(labels, logits))


def correct_per_example(labels, logits):
  """Correct predictions per example (correct tokens for per-token labels)."""
  predicted = tf.argmax(logits, axis=-1, output_type=labels.dtype)
  hits = tf.cast(predicted == labels, tf.float32)
  return tf.reshape(hits, [tf.shape(hits)[0], -1]) if hits.shape.rank > 1 \
      else hits[:, None]


def loss_and_grads(model, inputs, labels, global_batch_size: int,
                   loss_scale=None):
  """Forward and backward pass on one replica: (loss, logits, grads).

  The loss is divided by the GLOBAL batch: the SUM all-reduce of the grads
  then yields the gradient of the global mean loss, whatever the replica
  count. With `loss_scale` (float16), the grads are of loss * loss_scale,
  so small float16 gradients do not flush to zero; the loss is unscaled.
  """
  with tf.GradientTape() as tape:
    # The loss in float32 whatever the compute dtype (mixed precision).
    logits = tf.cast(model(inputs, training=True), tf.float32)
    loss = tf.nn.compute_average_loss(per_example_loss(labels, logits),
                                      global_batch_size=global_batch_size)
    if model.losses:
      loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    scaled = loss if loss_scale is None else loss * loss_scale
  return loss, logits, tape.gradient(scaled, model.trainable_variables)


def loss_scale_of(optimizer):
  """The dynamic loss scale variable of a LossScaleOptimizer, else None."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return optimizer.dynamic_scale
  return None


def make_train_step(strategy, model, optimizer, global_batch_size: int,
                    global_clipnorm: float = 0.0, timed: bool = False,
                    jit_compile: bool = False,
                    allreduce_dtype: str = "float32", bytes_per_pack: int = 0):
  """A tf.function running one step on every replica.

  Returns a function `(distributed_iterator) -> dict` with 'loss' and
  'correct' already reduced over all replicas, and 'grad_norm', the global
  norm of the all-reduced (unscaled) gradient. With `timed`, the step is
  instrumented with in-graph stamps (sync.STAMPS) and the dict also holds
  'step_start', 'inputs_ready', per-replica 'stamps' and every replica's
  'collective_waits' for sync.breakdown.

  `jit_compile=True` compiles each replica's forward and backward pass (its
  compute: where the FLOPs are) with XLA; the all-reduce and the update stay
  in the graph, because MirroredStrategy reaches its cross-device ops and
  its variables' updates through merge_call, which XLA cannot compile
  unless every device is a GPU ("tf.Variable on a different device",
  measured on logical CPUs). `jit_compile="step"` compiles the WHOLE replica
  step (forward, backward, all-reduce, update), as a TPU compiles it: for
  strategies without merge_call (one device, TPU, all-GPU Mirrored) and for
  tests that check a step is TPU-compilable; it cannot be timed
  (tf.timestamp has no XLA kernel).

  With a LossScaleOptimizer (train.precision=float16) the gradients are
  scaled until the update, which skips a step whose scaled gradients
  overflowed (and halves the scale); 'skipped' is then 1 and the step still
  counts (the optimizer's step counter advances), so the step count stays
  the number of batches read, which exact resume relies on.
  `allreduce_dtype` (bfloat16 | float16) casts the gradients for the
  all-reduce only: half the bytes on the wire, summed in that precision;
  `bytes_per_pack` packs it (sync.all_reduce_gradients).
  """
  variables = model.trainable_variables
  clock = sync.make_clock(strategy) if timed else None
  scale = loss_scale_of(optimizer)

  def compute(inputs, labels):
    loss, logits, grads = loss_and_grads(model, inputs, labels,
                                         global_batch_size, scale)
    grads = sync.dense_gradients(grads)  # Compute, not all-reduce: see there.
    return loss, num_correct(labels, logits), grads

  def update(grads):
    norm = tf.linalg.global_norm(grads)  # Same on every replica.
    # The global norm, after the reduction: also what tells the host that
    # the gradients became non-finite.
    grad_norm = norm if scale is None else norm / scale
    if global_clipnorm > 0:
      limit = global_clipnorm if scale is None else global_clipnorm * scale
      grads, _ = tf.clip_by_global_norm(grads, limit, use_norm=norm)
    optimizer.apply_gradients(zip(grads, variables))
    return grad_norm

  if jit_compile not in (False, True, "step"):
    raise ValueError(f"jit_compile={jit_compile!r}: False, True or 'step'.")
  if timed and jit_compile == "step":
    raise ValueError("timed steps cannot be XLA-compiled whole: tf.timestamp "
                     "has no XLA kernel; use jit_compile=True.")
  compute_fn = (tf.function(compute, jit_compile=True)
                if jit_compile is True else compute)

  def replica_step(inputs, labels, inputs_ready=None):
    if timed:
      start = sync.stamp_after([inputs, labels, inputs_ready], clock)
      inputs, labels = sync.after_stamp(start, (inputs, labels))
    loss, correct, grads = compute_fn(inputs, labels)
    if timed:
      grads_ready = sync.stamp_after(grads, clock)
      grads = sync.after_stamp(grads_ready, grads)
    grads = sync.all_reduce_gradients(grads, allreduce_dtype, bytes_per_pack)
    if timed:
      reduced = sync.stamp_after(grads, clock)
      grads = sync.after_stamp(reduced, grads)
    grad_norm = update(grads)
    if not timed:
      return loss, correct, grad_norm, (), ()
    # Reading every variable orders the last stamp after all their updates.
    end = sync.stamp_after([tf.identity(v.value) for v in variables], clock)
    waits = sync.gather_collective_wait(grads_ready, reduced, end)
    return (loss, correct, grad_norm,
            tf.stack([start, grads_ready, reduced, end]), waits)

  if jit_compile == "step":
    replica_step = tf.function(replica_step, jit_compile=True)

  def one_step(iterator):
    out = {}
    if timed:
      out["step_start"] = tf.timestamp()
      with tf.control_dependencies([out["step_start"]]):
        batch = next(iterator)
      out["inputs_ready"] = sync.stamp_after(
          [strategy.experimental_local_results(t)
           for t in tf.nest.flatten(batch)])
      # Replicas start after this stamp; otherwise, with every core busy
      # computing, TensorFlow may run it late and inflate the input wait.
      kwargs = {"inputs_ready": out["inputs_ready"]}
    else:
      batch, kwargs = next(iterator), {}
    loss, correct, grad_norm, stamps, waits = strategy.run(
        replica_step, args=batch, kwargs=kwargs)
    out["loss"] = strategy.reduce(_SUM, loss, axis=None)
    out["correct"] = strategy.reduce(_SUM, correct, axis=None)
    out["grad_norm"] = strategy.experimental_local_results(grad_norm)[0]
    out["skipped"] = _count_skipped_step(optimizer, scale, out["grad_norm"])
    if timed:
      out["stamps"] = tf.stack(strategy.experimental_local_results(stamps))
      # The same gathered vector on every replica: take the first.
      out["collective_waits"] = strategy.experimental_local_results(waits)[0]
    return out

  return tf.function(one_step)


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


def make_multi_step(strategy, model, optimizer, global_batch_size: int,
                    **step_options):
  """A tf.function `(iterator, n) -> dict` running up to n plain steps.

  One call per n steps instead of per step: host round trips dominate on
  TPUs (and cost ~1 ms of dispatch per step here). Returns the summed 'loss',
  'correct' and 'skipped', the last 'grad_norm' and 'steps' run; it stops
  early after a step with a non-finite loss or gradient norm (unless loss
  scaling skipped that step), so the host sees that step before anything is
  saved. `step_options` are make_train_step's (not `timed`).
  """
  step = make_train_step(strategy, model, optimizer, global_batch_size,
                         **step_options)
  body = step.python_function

  @tf.function
  def train_steps(iterator, n):
    loss, correct = tf.constant(0.0), tf.constant(0.0)
    norm, done, skipped = tf.constant(0.0), tf.constant(0), tf.constant(0)
    for _ in tf.range(n):
      out = body(iterator)
      loss += out["loss"]
      correct += out["correct"]
      skipped += out["skipped"]
      norm, done = out["grad_norm"], done + 1
      diverged = tf.logical_not(tf.math.is_finite(out["loss"])) or (
          tf.logical_not(tf.math.is_finite(norm)) and out["skipped"] == 0)
      if diverged:
        break
    return {"loss": loss, "correct": correct, "grad_norm": norm,
            "steps": done, "skipped": skipped}

  return train_steps


def make_eval_pass(strategy, model):
  """A tf.function `(distributed_dataset) -> [loss_sum, correct, predictions,
  examples]` over an exact eval dataset (data.dataset_fn): padding examples
  have weight 0 and count nowhere."""

  def replica_step(inputs, labels, ids, weights):
    del ids  # Used by tests that check exactly-once; not by the metrics.
    logits = tf.cast(model(inputs, training=False), tf.float32)
    hits = correct_per_example(labels, logits)  # [batch, tokens]
    return tf.stack([
        tf.reduce_sum(weights * per_example_loss(labels, logits)),
        tf.reduce_sum(weights[:, None] * hits),
        tf.reduce_sum(weights) * tf.cast(tf.shape(hits)[1], tf.float32),
        tf.reduce_sum(weights)])

  @tf.function
  def eval_pass(dataset):
    totals = tf.zeros([4])
    for batch in dataset:
      totals += strategy.reduce(_SUM, strategy.run(replica_step, args=batch),
                                axis=None)
    return totals

  return eval_pass


def evaluate(eval_pass, dataset) -> dict:
  """Runs one eval pass; returns accuracy, loss and the examples seen."""
  loss_sum, correct, predictions, examples = eval_pass(dataset).numpy()
  return {"accuracy": float(correct / max(predictions, 1.0)),
          "loss": float(loss_sum / max(examples, 1.0)),
          "examples": int(round(examples))}
