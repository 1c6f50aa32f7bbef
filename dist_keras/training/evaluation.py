"""One pass of the eval split: every example counted once, at any replica
and worker count, for the loss, every per-output loss and every metric.

Each replica runs the model's `test_step` on its batches (Keras' own, or the
model's override), as Keras' `evaluate` does. Replicas that run out of data
before the others get empty batches from TensorFlow, which never reach the
model: such a replica runs it on one zero example instead (a padded
sequence's length, a ragged one's longest row, taken from a replica with
examples) and puts its metrics back, so the example counts nowhere. Every replica must run the
model at every step: a layer updating a variable of aggregation "mean" or
"sum" synchronises the replicas there (a merge_call, which TensorFlow
refuses inside a tf.cond and which would wait for a replica that skipped
it). Keras weighs its per-output loss trackers by a batch's STATIC size,
unknown for a partial last batch (which then counted like a full one, so
the per-output losses moved with the replica count); each of their updates
is re-weighed here by the batch's examples. A model's own test_step whose
logs name values of its own is reported as Keras' evaluate reports it:
those values at the last step (MetricState.results).

Under train.jit_compile=true each replica's test_step is one XLA
computation, as Keras' fit(jit_compile=True) compiles evaluate's (XLA
compiles it again for each batch size met: full, a partial last batch, a
replica's one zero example); what surrounds it (an empty batch's
stand-in, the re-weighing) stays outside, as the train step's all-reduce
does. A TPUStrategy compiles the whole replica step anyway. check_compiles
tries that compilation before training, so a test_step XLA cannot compile
is refused at the start, not found after training steps were paid for.
"""
import time

import keras
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract import batches, xla_limits
from dist_keras.contract.checks import overrides
from dist_keras.distribute import pipelines
from dist_keras.errors import UserError
from dist_keras.training import (call_losses, keras_internals, metrics,
                                 model_step, replica_seeds, steps)

_SUM = tf.distribute.ReduceOp.SUM


def make_eval_pass(strategy, model, jit_compile=False):
  """A tf.function `(distributed_dataset) -> ([examples, steps], logs)`
  over one pass of a finite eval dataset; it updates the model's metrics.
  `logs` are a model's own test_step's at the pass's last step (Keras'
  evaluate reports them where they name other things than the model's
  metrics): each replica's weighed by its examples, so that a mean over
  the batch is the global batch's; {} where the step is Keras' own (its
  logs are the metrics). `jit_compile` (train.jit_compile's value, or a
  steps.Jit) XLA-compiles each replica's test_step (_compiles)."""
  trackers = keras_internals.output_loss_trackers(model)
  keeps_logs = any(overrides(model, name) for name in (
      "test_step", "compute_metrics", "get_metrics_result"))
  weighs = strategy.num_replicas_in_sync > 1
  test_step = _test_step(model, _compiles(strategy, jit_compile))

  def replica_step(batch):
    batch = pipelines.with_nones(batch)
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    examples = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
    variables = list(model.metrics_variables)
    # Read now (identity: a variable itself would be read after the update).
    before = [(tf.identity(t.total.value), tf.identity(t.count.value))
              for t in trackers]
    kept = [tf.identity(v.value) for v in variables]
    # An empty batch is not run through the model: TF 2.21's oneDNN fused
    # Conv2D+Relu fails on one ("input depth must be evenly divisible by
    # filter depth") on AVX-512 hosts.
    logs = test_step(_never_empty(batch, examples > 0))
    with tf.control_dependencies(tf.nest.flatten(logs)):
      _reweigh(trackers, before, examples)
      restored = tf.cond(examples > 0, tf.no_op, lambda: tf.group(
          [v.assign(value) for v, value in zip(variables, kept)]))
    logs = logs if keeps_logs else {}
    with tf.control_dependencies([restored]):
      # A replica's zero example weighs nothing (multiply_no_nan: not
      # even a NaN of it).
      return tf.identity(examples), {
          name: tf.math.multiply_no_nan(value, examples) if weighs else value
          for name, value in logs.items()}

  # A model drawing in inference (a VAE's sampling) draws per replica too.
  replica_step = replica_seeds.per_replica(replica_step)

  def add_batch(state, batch):
    totals, _ = state
    examples, logs = strategy.run(replica_step, args=(batch,))
    examples = strategy.reduce(_SUM, examples, axis=None)
    logs = {name: strategy.reduce(_SUM, value, axis=None)
            for name, value in logs.items()}
    if weighs:
      logs = {name: value / examples for name, value in logs.items()}
    return totals + tf.stack([examples, 1.0]), logs

  @tf.function(autograph=False)
  def eval_pass(dataset):
    return _reduce(dataset, add_batch, keeps_logs)

  return keras_internals.made_per_run(eval_pass)  # Traced once a run.


def _test_step(model, jit: bool):
  """(batch) -> the model's test_step's flat logs; with `jit`, one XLA
  computation, as Keras' fit(jit_compile=True) compiles the test_step
  of evaluate (named so XLA's errors tell it from the train step's).
  A Loss reduced in the model's call is left undivided (call_losses), in
  Keras' test_step and a model's own alike: the eval differentiates
  nothing, so that is one device's value; an own step's compute_loss then
  divides it once, as it divides the compiled loss (its start line says
  so: step_losses), where fit divided it twice (1/N^2)."""

  def eval_test_step(batch):
    with call_losses.as_one_device():
      return model_step.flat_logs(model.test_step(batch))

  eval_test_step.__name__ = xla_limits.EVAL_FUNCTION  # (Its graph's.)
  if not jit:
    return eval_test_step
  # Made twice a run (check_compiles, make_eval_pass), each traced once.
  return keras_internals.made_per_run(
      tf.function(eval_test_step, jit_compile=True))


def _compiles(strategy, jit_compile) -> bool:
  """Whether the eval compiles each replica's test_step with XLA: under
  train.jit_compile, except on a TPU (which compiles the whole step)."""
  return steps.Jit.of(jit_compile) is not steps.Jit.OFF and not isinstance(
      strategy, tf.distribute.TPUStrategy)


def check_compiles(strategy, model, eval_spec, jit_compile) -> None:
  """Refuses, before training, an eval step XLA cannot compile where the
  eval compiles one (`jit_compile`: train.jit_compile's; not on a TPU), as
  fit(jit_compile=True) fails a test_step with a tf.numpy_function at its
  first validation: each replica's test_step lowered to XLA on a zero
  batch like `eval_spec`'s (batches.zeros: what the model met). Nothing
  runs. An error that is not XLA's is left to the eval.

  Raises:
    UserError: ops XLA has no kernel for, or another refusal of XLA's
      (xla_limits.eval_refusal).
  """
  if not _compiles(strategy, jit_compile):
    return
  test_step = _test_step(model, jit=True)

  def lower():
    test_step.experimental_get_compiler_ir(batches.zeros(eval_spec))(
        stage="hlo")

  try:
    with installation.keras_name_scopes_kept():
      strategy.run(lower)
  except Exception as e:  # pylint: disable=broad-except
    bad = xla_limits.eval_refusal(e)
    if bad is not None:
      raise bad from e


def _never_empty(batch, has_examples):
  """`batch`, or one zero example in place of an empty one: each tensor's
  zeros ("" for strings), of its shape but for the batch size; a ragged
  one's a row of its longest row's length, a sparse one's no values.

  TensorFlow makes an empty batch's unknown dimensions 0 (a padded batch's
  time length, every ragged row: a GRU fails on a sequence of none), so a
  tensor with one takes the shape a replica with examples has at this
  step."""
  leaves = tf.nest.flatten(batch)
  kept = [i for i, t in enumerate(leaves) if isinstance(
      t, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)) and t.shape.rank != 0]
  shapes = [_dense_shape(leaves[i]) for i in kept]
  if any(not leaves[i].shape[1:].is_fully_defined() for i in kept):
    shapes = _shapes_with_examples(shapes, has_examples)
  for i, shape in zip(kept, shapes):
    leaves[i] = _or_one_zero(leaves[i], shape, has_examples)
  return tf.nest.pack_sequence_as(batch, leaves)


def _dense_shape(t):
  """The int32 shape of `t`, a ragged tensor's bounding one (its longest
  rows)."""
  if isinstance(t, tf.RaggedTensor):
    return tf.cast(t.bounding_shape(), tf.int32)
  if isinstance(t, tf.SparseTensor):
    return tf.cast(t.dense_shape, tf.int32)
  return tf.shape(t)


def _or_one_zero(t, shape, has_examples):
  """`t`, or one example of zeros of `shape` but for the batch size."""
  one = tf.concat([[1], shape[1:]], 0)
  if isinstance(t, tf.RaggedTensor):
    zeros = lambda: tf.RaggedTensor.from_tensor(
        tf.zeros(one, t.dtype), ragged_rank=t.ragged_rank,
        row_splits_dtype=t.row_splits.dtype)
  elif isinstance(t, tf.SparseTensor):  # No values: all zeros.
    static = t.shape[1:].is_fully_defined()
    zeros = lambda: tf.SparseTensor(
        tf.zeros([0, tf.size(one)], tf.int64), tf.zeros([0], t.dtype),
        tf.constant([1, *t.shape[1:]], tf.int64) if static
        else tf.cast(one, tf.int64))
  else:
    zeros = lambda: tf.zeros(one, t.dtype)
  padded = tf.cond(has_examples, lambda: t, zeros)
  if isinstance(padded, tf.Tensor):
    padded.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
  return padded


def _shapes_with_examples(shapes, has_examples):
  """`shapes` (this replica's tensors' dynamic shapes) as the first
  replica with examples at this step has them: one all-gather of a few
  integers a step, traced only for batches whose shape leaves a size
  unknown."""
  sizes = [tf.size(shape) for shape in shapes]
  mine = tf.concat([[tf.cast(has_examples, tf.int32)], *shapes], 0)
  every = tf.distribute.get_replica_context().all_gather(
      mine[tf.newaxis], axis=0)
  # Some replica has examples at every step of the pass: a step comes only
  # while one has a batch.
  theirs = every[tf.argmax(every[:, 0])]
  return tf.split(theirs[1:], sizes)


def _reweigh(trackers, before, examples) -> None:
  """Makes each tracker's last update count `examples` times its batch's
  loss, whatever weight Keras gave it (a test_step that left a tracker
  alone leaves it as it was)."""
  for tracker, (total, count) in zip(trackers, before):
    added = tracker.count.value - count
    value = tf.math.divide_no_nan(tracker.total.value - total, added)
    updated = tf.cast(added > 0, tf.float32)
    tracker.total.assign(total + updated * value * examples)
    tracker.count.assign(count + updated * examples)


def _reduce(dataset, reduce_fn, peel: bool):
  """The state ([examples, steps], logs) after `reduce_fn` over every
  element, in a while loop over the dataset's iterator: a distributed
  dataset's own reduce (what AutoGraph makes of a `for` over it), written
  out so a plain tf.data.Dataset (input.reads_on_host) runs the step the
  same way: tf.data.Dataset.reduce would run the model inside tf.data's
  runtime. With `peel`, the first element is reduced before the loop: the
  logs a loop carries must exist before it, and only a step traced tells
  their names and shapes."""
  iterator = iter(dataset)
  state = (tf.zeros([2]), {})
  optional = iterator.get_next_as_optional()
  if peel:
    traced = []

    def first():
      traced.append(reduce_fn(state, optional.get_value()))
      return traced[0]

    def none():  # No element at all (traced after first(): cond_v2's order).
      return tf.nest.map_structure(
          lambda t: tf.zeros([d or 0 for d in t.shape], t.dtype), traced[0])

    state = tf.cond(optional.has_value(), first, none)
    optional = iterator.get_next_as_optional()

  def body(optional, state):
    state = reduce_fn(state, optional.get_value())
    return iterator.get_next_as_optional(), state

  _, state = tf.while_loop(lambda optional, _: optional.has_value(), body,
                           [optional, state], parallel_iterations=1)
  return state


def evaluate(eval_pass, metric_state, dataset) -> dict:
  """One eval pass: {'loss' and every metric as the model reports them
  (Keras' `evaluate` names; a model's own test_step's logs where they name
  other things: MetricState.results), 'examples', 'steps', 'seconds' (its
  wall time) and 'traced' (whether it traced and compiled the pass: the
  first one, seconds to minutes for a large model)}; the metrics are reset
  first."""
  metric_state.model.reset_metrics()
  traces, start = eval_pass.experimental_get_tracing_count(), time.monotonic()
  totals, logs = eval_pass(dataset)
  examples, steps = totals.numpy()
  if not examples:  # Its loss and metrics would read 0: no eval at all.
    raise UserError(
        "dataset_fn('eval', ...) gave no examples (every replica's batches "
        "were empty): give the eval split examples (built-in data: "
        f"data.eval_size >= 1){batches.OR_NONE}.")
  result = metric_state.results(
      metric_state.read(),
      {name: metrics.logged(value) for name, value in logs.items()})
  result["examples"] = int(round(examples))
  result["steps"] = int(round(steps))
  result["seconds"] = time.monotonic() - start
  result["traced"] = eval_pass.experimental_get_tracing_count() > traces
  return result
