"""Random draws whose state no checkpoint keeps in what a model trains
with, said at the start in one line, the fix first.

Three kinds, each found by tracing (nothing runs):
- TensorFlow's stateful random ops (`tf.random.normal`, `uniform`,
  `shuffle` ...: RandomStandardNormal, RandomUniform, ... ops) keep their
  generator state inside the op's kernel, seeded from the op's place in
  the traced graph: a resumed run draws the first numbers again, and
  Keras' fit traces another graph, so it draws others (keras.io's WGAN-GP,
  tf.random.normal in its train_step: weights 0.011 off fit after 8 steps
  on one device, and 0.011 off the uninterrupted run resumed after step 6,
  2026-12-07);
- `keras.random.*` drawing from a SeedGenerator the model does not hold:
  Keras' global one (no seed=), whose state variable is in no checkpoint
  (dist_keras' saves the model's variables, and fit's BackupAndRestore
  its save_weights): resumed after step 4 of 8, 0.49 off the
  uninterrupted run (2026-12-07);
- a `tf.random.Generator` (its draws are RngReadAndSkip ops on its state,
  a tf.Variable, not a Keras one: not among the model's variables the
  checkpoint keeps): resumed 0.31 off.
Draws from a SeedGenerator the model holds (Dropout's, `keras.random.normal(
..., seed=self.seed_generator)`) read a variable the checkpoint keeps, and
`seed=<int>` draws the same numbers every step: both resume exactly and
are said nothing.

Said, not refused: such a model still trains (its numbers are drawn from
the same distributions, as fit's are on each of its runs); what it loses
is the bitwise replay. Traced: the model's own train_step in each replica
with its optimizers' apply recorded only (step_optimizers.StepTrace: the
one trace the optimizers' build reads too); else
Keras' (the call and compute_loss) where the model has its own
compute_loss; else the training call of a model with a layer of its own (a
Lambda's included); Keras' own layers draw from SeedGenerators they hold,
so a model of them alone is not traced. Nested functions (tf.cond,
tf.while_loop, a tf.function of its own) are looked into.
"""
import contextlib
import inspect
import os
import re
import traceback

import keras
from keras.src.random import seed_generator

from dist_keras import origins
from dist_keras.contract import model_calls
from dist_keras.contract.checks import overrides
from dist_keras.errors import UserError
from dist_keras.training import state_updates, step_optimizers

# Each stateful random op, as the TensorFlow and Keras calls that make it.
_STATEFUL = {
    "RandomStandardNormal": ("tf.random.normal", "keras.random.normal"),
    "RandomUniform": ("tf.random.uniform", "keras.random.uniform"),
    "RandomUniformInt": ("tf.random.uniform", "keras.random.randint"),
    "TruncatedNormal": ("tf.random.truncated_normal",
                        "keras.random.truncated_normal"),
    "ParameterizedTruncatedNormal": ("tf.random.truncated_normal",
                                     "keras.random.truncated_normal"),
    "RandomShuffle": ("tf.random.shuffle", "keras.random.shuffle"),
    "Multinomial": ("tf.random.categorical", "keras.random.categorical"),
    "RandomGamma": ("tf.random.gamma", "keras.random.gamma"),
    "RandomPoisson": ("tf.random.poisson", "tf.random.stateless_poisson"),
    "RandomPoissonV2": ("tf.random.poisson", "tf.random.stateless_poisson"),
}
# A tf.random.Generator's draws: ops on its state variable (inputs[0]).
_GENERATOR = ("RngReadAndSkip", "RngSkip", "StatefulRandomBinomial",
              "StatefulStandardNormal", "StatefulStandardNormalV2",
              "StatefulUniform", "StatefulUniformInt",
              "StatefulUniformFullInt", "StatefulTruncatedNormal")
# A SeedGenerator's draw assigns its state in this file (SeedGenerator.next).
_SEEDS = os.path.abspath(inspect.getfile(keras.random.SeedGenerator))
# Attributes of the ops that call functions of their own.
_CALLED = ("f", "then_branch", "else_branch", "body", "cond", "branches")


def note(step: step_optimizers.StepTrace, layers: list,
         forward=None) -> str | None:
  """The line for the random draws whose state no checkpoint keeps in what
  `step.model` trains with (its own train_step's, traced once for this
  and the optimizers' build: `step`; else Keras' with its own
  compute_loss; else its training call's: `forward`'s graph where
  state_updates.traced traced it already), or None: none, nothing of the
  user's to trace, or a step that cannot be traced (left to its step)."""
  model, strategy = step.model, step.strategy
  own_step = overrides(model, "train_step")
  own_loss = not own_step and overrides(model, "compute_loss")
  if not (own_step or own_loss or _has_own_layer([model, *layers])):
    return None
  with _global_seed_draws() as drawn:
    try:
      if own_step:
        graph = step.own_step()[0]
      elif own_loss:
        graph = step_optimizers.traced_step(
            lambda batch: _keras_step(model, batch), strategy,
            step.optimizers.values(), step.batch_spec)
      elif forward is not None:
        graph = forward.graph
      else:
        graph = model_calls.traced(model, strategy, step.batch_spec, True)[0]
    except Exception:  # pylint: disable=broad-except
      _refuse_global_seed_per_replica(drawn, model, strategy)
      return None  # Left as Keras runs it: its own error at its step.
  found = unkept_draws(graph, model.variables)
  if not found:
    return None
  where = (f"{type(model).__name__}.train_step" if own_step else
           f"{type(model).__name__}.compute_loss or call" if own_loss
           else f"the training call of model {model.name!r}")
  return _line(where, found)


@contextlib.contextmanager
def _global_seed_draws():
  """The user frames (file, line, function) that reach Keras' global
  SeedGenerator (keras.random.* without seed=) in the block, any thread."""
  drawn, keras_global = [], seed_generator.global_seed_generator

  def recorded():
    drawn.append(_user_frames(traceback.extract_stack())[0])
    return keras_global()

  seed_generator.global_seed_generator = recorded
  try:
    yield drawn
  finally:
    seed_generator.global_seed_generator = keras_global


def _refuse_global_seed_per_replica(drawn: list, model, strategy) -> None:
  """Raises UserError where a trace that failed drew from Keras' global
  SeedGenerator at N > 1 replicas: Keras keeps it per thread, so each
  replica's thread makes its state inside the traced step, which
  TensorFlow refuses (Keras' fit under MirroredStrategy fails the same,
  with its "singleton tf.Variables" ValueError at the first step)."""
  if not drawn or strategy.num_replicas_in_sync < 2:
    return
  user = next((f for f in drawn if f is not None), None)
  at = f" ({_at(user)})" if user is not None else ""
  raise UserError(
      "pass seed=self.seed_generator, a keras.random.SeedGenerator made in "
      f"__init__, to keras.random.*: {type(model).__name__} draws without "
      f"seed={at}, and at {strategy.num_replicas_in_sync} replicas each "
      "replica's thread makes Keras' global seed state inside the step, "
      "which TensorFlow refuses (as under Keras' fit)")


def _has_own_layer(layers: list) -> bool:
  """Whether one of `layers` is of a class not Keras' own, or a Lambda
  (which runs the user's function)."""
  return any(not state_updates.keras_own(layer)
             or isinstance(layer, keras.layers.Lambda) for layer in layers)


def _keras_step(model, batch):
  """What Keras' train_step computes before its gradients, as the run's
  steps (steps.py) call it: the model's call and its own compute_loss."""
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
  y_pred = model_calls.forward(model, x, training=True)
  return model_calls.compute_loss(model, x, y, y_pred, sample_weight,
                                  training=True)


def unkept_draws(graph, kept) -> list:
  """The random draws of `graph` and of the functions it calls whose state
  no checkpoint keeps (none of the `kept` variables'): stateful random
  ops, tf.random.Generator ops, SeedGenerator draws of another state; one
  per place in the code (a replica's copy, or a Python loop's, once), in
  graph order."""
  found, places, todo, seen = [], set(), [graph], set()
  held = _handles(kept)  # Grows by each graph's captures of them.
  while todo:
    current = todo.pop(0)
    if id(current) in seen:
      continue
    seen.add(id(current))
    held.update(id(inner) for outer, inner in current.captures
                if id(outer) in held)
    for op in current.get_operations():
      todo.extend(_called_graphs(op))
      if _draws_unkept(op, held) and _place(op) not in places:
        places.add(_place(op))
        found.append(op)
  return found


def _handles(variables) -> set:
  """The ids of the resource handles of `variables` (each replica's)."""
  held = set()
  for variable in variables:
    inner = getattr(variable, "value", variable)
    for component in getattr(inner, "values", (inner,)):  # Mirrored: each.
      held.add(id(component.handle))
  return held


def _draws_unkept(op, held: set) -> bool:
  """Whether `op` draws a random number from a state no checkpoint keeps
  (`held`: the ids of the kept variables' handles in op's graph)."""
  if op.type in _STATEFUL:
    return True
  if op.type in _GENERATOR:
    return id(op.inputs[0]) not in held
  return (op.type == "AssignVariableOp" and id(op.inputs[0]) not in held
          and any(os.path.abspath(frame.filename) == _SEEDS
                  for frame in getattr(op, "traceback", None) or []))


def _called_graphs(op) -> list:
  """The graphs of the functions `op` calls (none for most ops).
  TensorFlow has no public lookup of a graph's function by name."""
  graphs = []
  for attr in _CALLED:
    try:
      value = op.get_attr(attr)
    except (ValueError, TypeError):
      continue
    for function in value if isinstance(value, list) else [value]:
      try:
        graphs.append(op.graph._get_function(function.name).graph)  # pylint: disable=protected-access
      except (AttributeError, ValueError, TypeError):
        continue
  return graphs


def _frames(op) -> tuple:
  """_user_frames of the code that made `op`."""
  return _user_frames(list(getattr(op, "traceback", None) or []))


def _user_frames(stack: list) -> tuple:
  """(the innermost frame of `stack` outside TensorFlow, Keras, dist_keras
  and Python's own modules, the frame it called), each None if none."""
  for i in range(len(stack) - 1, -1, -1):
    if origins.users(os.path.abspath(stack[i].filename)):
      return stack[i], stack[i + 1] if i + 1 < len(stack) else None
  return None, None


def _place(op) -> tuple:
  """Where `op` was made: its user frame's file and line, else its name
  with no replica prefix."""
  frame = _frames(op)[0]
  if frame is not None:
    return (frame.filename, frame.lineno)
  return (re.sub(r"^replica_\d+/", "", op.name),)


def _at(frame) -> str:
  """`frame`'s place as a line says it: file:line in function."""
  return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


def _keras_call(op) -> str:
  """The keras.random function to draw what `op` draws."""
  if op.type in _STATEFUL:
    return _STATEFUL[op.type][1]
  called = _frames(op)[1]  # keras.random.normal, Generator.normal ...
  name = getattr(called, "name", "")
  return f"keras.random.{name}" if hasattr(keras.random, name) else (
      "keras.random.*")


def _line(where: str, found: list) -> str:
  """The one line naming the first of `found` and the fix first."""
  first = found[0]
  call = _keras_call(first)
  frame = _frames(first)[0]
  at = _at(frame) if frame is not None else f"op {_place(first)[0]!r}"
  at += f"; {len(found) - 1} more" if len(found) > 1 else ""
  fix = "a keras.random.SeedGenerator made in __init__"
  if first.type in _STATEFUL:
    return (f"use {call}(..., seed=self.seed_generator), {fix}: {where} "
            f"draws with {_STATEFUL[first.type][0]} ({at}), whose state no "
            "checkpoint keeps: resumes and fit differ")
  if first.type in _GENERATOR:
    return (f"use {call}(..., seed=self.seed_generator), {fix}: {where} "
            f"draws with a tf.random.Generator ({at}), whose state no "
            "checkpoint keeps: resumes differ")
  return (f"pass seed=self.seed_generator, {fix}, to {call}: {where} draws "
          f"from a seed state outside the model (Keras' global without "
          f"seed=; {at}), which no checkpoint keeps: resumes differ")
