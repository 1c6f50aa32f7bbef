"""Gathered gradient slices whose count changes from step to step: one step
per call.

An Embedding's gradient is a tf.IndexedSlices, a slice per looked-up token,
and N replicas' slices are gathered (allreduce.py). Their count is the
replica's batch's number of tokens: where the batch's shape leaves a size
open (a padded or bucketed sequence's length, a ragged or sparse feature),
it changes from step to step and from replica to replica. TensorFlow 2.21
gathers them with collectives whose instances are set when the step is
traced; in a loop of several steps in one call (calls.py) every iteration
reuses them, and a shape that changed between iterations fails the call
("Shape mismatch in the collective instance ... expected shape [608,8] but
another member ... [928,8]", pure TensorFlow too, at any
parallel_iterations). One step a call trains them (= fit). Padding the
slices to a fixed count would need a maximum that such a batch's shape
does not give.

A model can make such a length itself from batches of fixed shape
(TextVectorization(output_sequence_length=None), Keras' default, on a
string[b] batch; a tf.unique, a boolean_mask): the batches' spec cannot
tell, the gradient can. Found at the start, from the train batches' spec:
the model's gradients traced on it (in each replica, as a layer that
all-reduces in its forward pass needs; not run: 0.4-0.8 s for a small
model at 2 replicas), where a part of the batches has a size left open or
holds strings. Batches of numbers of fixed shape are not traced (that
cost at every start, for a length a model rarely makes from them); a
call that then fails is said in one line (mismatch). Not for a model's
own train_step, whose gradients are its own.
"""
import keras
import tensorflow as tf

from dist_keras.contract import batches, checks, model_calls
from dist_keras.errors import UserError

def one_step_per_call(model, strategy, met, train_cfg) -> str | None:
  """Runs one step per call (train.steps_per_loop=0 -> 1) where the model's
  step gathers slices of a count the train batches (`met.spec`,
  contract/probe.py) leave open; the line saying so, or None.

  Raises:
    UserError: train.steps_per_loop (or the model's steps_per_execution)
      > 1 for such a model.
  """
  if (train_cfg.steps_per_loop == 1 or strategy.num_replicas_in_sync == 1
      or isinstance(strategy, tf.distribute.TPUStrategy)  # Densified there.
      or checks.overrides(model, "train_step")
      or _fixed_numbers(met.spec)):
    return None
  varying = _open_slices(model, strategy, met.spec)
  if not varying:
    return None
  path, ids = varying[0]
  made_inside = _fixed_shapes(met.spec)
  lost_batch = made_inside and _batch_lost(ids)
  where = (f"a length the model makes from each batch of fixed shape "
           f"({batches.describe(met.spec)})" if made_inside
           else batches.describe(met.spec))
  if lost_batch:
    where = (f"the ids it looks up are shaped {_shape(ids)} for batches of "
             f"fixed shape ({batches.describe(met.spec)}): a layer before it"
             " loses their batch dimension, as TextVectorization does")
  why = (f"the gradient of {path} is gathered as slices whose number "
         f"changes from batch to batch ({where}), which TensorFlow cannot "
         "gather in a loop of several steps in one call")
  if train_cfg.steps_per_loop:
    fixed = (_LOST_BATCH_FIX.format(rest=", ".join(map(str, ids[1:])))
             if lost_batch else None)
    _refuse(model, train_cfg.steps_per_loop, why, made_inside, fixed)
  train_cfg.steps_per_loop = 1
  return f"steps per call: 1 ({why})"


# A static batch size, from the model's input, given back to the ids.
_LOST_BATCH_FIX = (
    "give the ids the batch's size back after that layer: "
    "keras.layers.Lambda(lambda t: keras.ops.reshape(t[0], "
    "(keras.ops.shape(t[1])[0], {rest})))([ids, inputs])")


def _batch_lost(ids) -> bool:
  """Whether looked-up ids of shape `ids` (or None) lack only their batch
  dimension: TextVectorization(output_sequence_length=N) gives [None, N]
  for a string[b] batch."""
  return (ids is not None and ids.rank is not None and ids.rank >= 2
          and ids[0] is None and ids[1:].is_fully_defined())


def _shape(shape) -> str:
  return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _refuse(model, steps_per_loop: int, why: str, made_inside: bool,
            fixed: str | None = None):
  """Raises the UserError of several steps a call set for such a model;
  `fixed`: the model's fix, where known."""
  per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
  setting, fix = (f"train.steps_per_loop={steps_per_loop}",
                  "set train.steps_per_loop=1")
  if per_execution > 1:  # (compiled.take made it steps_per_loop.)
    setting = (f"model {model.name!r} was compiled with "
               f"steps_per_execution={per_execution}")
    fix = "compile it with steps_per_execution=1"
  fixed = fixed or (
      "fix that length in the model (e.g. TextVectorization("
      "output_sequence_length=N))" if made_inside else
      "give the batches static shapes (padded_batch(..., "
      "padded_shapes=...), tf.ensure_shape)")
  raise UserError(f"{setting}, but {why}; {fix}, or {fixed}.")


def _fixed_numbers(batch_spec) -> bool:
  """Whether every part of the batches is a dense tensor of numbers of
  static shape: the one kind not traced (a length the model makes from
  numbers, a tf.unique's, is rare; mismatch() says it if it comes)."""
  return _fixed_shapes(batch_spec) and all(
      s.dtype != tf.string for s in tf.nest.flatten(batch_spec))


def mismatch(error: Exception) -> UserError | None:
  """The UserError for TensorFlow's failure of a call of several steps
  whose gathered slices changed count between them (a length the model
  makes from batches of fixed shape, not looked for at the start), else
  None."""
  if "Shape mismatch in the collective instance" not in str(error):
    return None
  return UserError(
      "a gradient's slices changed in number between the steps of one call"
      " (a length the model makes from each batch, such as a tf.unique's "
      "or a boolean_mask's), which TensorFlow cannot gather in a loop of "
      "several steps in one call; set train.steps_per_loop=1, or fix that "
      "length in the model.")


def _fixed_shapes(batch_spec) -> bool:
  """Whether every part of the batches is a dense tensor of static shape."""
  return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
             for s in tf.nest.flatten(batch_spec))


def _open_slices(model, strategy, batch_spec) -> list[tuple]:
  """(path, the shape of the ids looked up, or None) of the trainable
  variables whose gradient, traced on a batch of `batch_spec` in each
  replica (a mirrored variable is read there only), is an IndexedSlices of
  a count not known before the step runs (nothing runs; the trace is
  dropped)."""
  variables = model.trainable_variables
  found = {}

  def gradients(batch):
    # The step's loss and gradients (steps.forward_backward) without the
    # optimizer, not yet built (a loss scale's variable with it).
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    with tf.GradientTape() as tape:
      y_pred = model_calls.forward(model, x, training=True)
      loss = model_calls.compute_loss(model, x, y, y_pred, sample_weight,
                                training=True)
    grads = tape.gradient(loss, variables)
    found.update((v.path, _ids_shape(g)) for v, g in zip(variables, grads)
                 if isinstance(g, tf.IndexedSlices)
                 and g.indices.shape[0] is None)
    return tf.constant(0)

  def step(batch):
    return strategy.run(gradients, args=(batch,))

  with strategy.scope():
    tf.function(step, autograph=False).get_concrete_function(batch_spec)
  return list(found.items())


def _ids_shape(gradient):
  """The shape of the ids an Embedding looked up (its gradient's indices
  are them flattened by a Reshape), or None where the indices came
  otherwise."""
  op = gradient.indices.op
  return op.inputs[0].shape if op.type == "Reshape" else None
