"""TensorFlow's stateful random ops in what a model trains with, said at
the start in one line.

`tf.random.normal`, `tf.random.uniform`, `tf.random.shuffle` and their
kin (RandomStandardNormal, RandomUniform, ... ops) keep their generator
state inside the op's kernel, seeded from the op's place in the traced
graph: no checkpoint holds it, so a resumed run draws the first numbers
again, not the next ones, and Keras' fit traces another graph, so it
draws others (keras.io's WGAN-GP, tf.random.normal in its train_step:
weights 0.011 off fit after 8 steps on one device, and a run resumed
after step 6 0.011 off the uninterrupted one, 2026-12-07). Draws from a
keras.random.SeedGenerator (Dropout's, `keras.random.normal(...,
seed=self.seed_generator)`) are stateless ops reading a variable the
checkpoint keeps: exact, and not looked at here.

Said, not refused: a GAN or VAE written so still trains (its numbers are
drawn from the same distributions, as fit's are on each of its runs);
what it loses is the bitwise replay, which the line names with the fix.
Found by tracing (nothing runs) the model's own train_step in each replica
with its optimizers' apply recorded only (step_optimizers.recording), or
the training call of a model with a layer of its own (a Lambda's
included); Keras' own layers draw from SeedGenerators, so a model of them
alone is not traced. Nested functions (tf.cond, tf.while_loop, a
tf.function of its own) are looked into.
"""
import contextlib
import os
import re

import keras
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract import model_calls
from dist_keras.contract.checks import overrides
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
# Attributes of the ops that call functions of their own.
_CALLED = ("f", "then_branch", "else_branch", "body", "cond", "branches")
_LIBRARIES = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                   for m in (tf, keras, installation, os))


def note(model, layers: list, strategy, optimizers: dict, batch_spec,
         forward=None) -> str | None:
  """The line for the stateful random ops the model trains with (its own
  train_step's, else its training call's: `forward`'s graph where
  state_updates.traced traced it already), or None: none, nothing of the
  user's to trace, or a step that cannot be traced (left to its step)."""
  own_step = overrides(model, "train_step")
  if not own_step and not _has_own_layer([model, *layers]):
    return None
  try:
    if own_step:
      graph = _traced_step(model, strategy, optimizers, batch_spec)
    elif forward is not None:
      graph = forward.graph
    else:
      graph = model_calls.traced(model, strategy, batch_spec, True)[0]
  except Exception:  # pylint: disable=broad-except
    return None  # Left as Keras runs it: its own error at its step.
  found = stateful_ops(graph)
  if not found:
    return None
  where = (f"{type(model).__name__}.train_step" if own_step
           else f"the training call of model {model.name!r}")
  return _line(where, found)


def _has_own_layer(layers: list) -> bool:
  """Whether one of `layers` is of a class not Keras' own, or a Lambda
  (which runs the user's function)."""
  return any(not state_updates.keras_own(layer)
             or isinstance(layer, keras.layers.Lambda) for layer in layers)


def _traced_step(model, strategy, optimizers: dict, batch_spec):
  """The graph of the model's train_step traced in each replica on
  `batch_spec` (as the loop's step calls it), its optimizers' apply and
  build only recording their variables meanwhile: nothing moves."""

  def step(batch):
    strategy.run(model.train_step, args=(batch,))
    return tf.constant(0)

  with (strategy.scope(), installation.keras_name_scopes_kept(),
        contextlib.ExitStack() as stack):
    for optimizer in optimizers.values():
      stack.enter_context(step_optimizers.recording(optimizer, {}))
    function = tf.function(step, autograph=False)
    return function.get_concrete_function(batch_spec).graph


def stateful_ops(graph) -> list:
  """The stateful random ops of `graph` and of the functions it calls,
  one per place in the code (a replica's copy, or a Python loop's, once),
  in graph order."""
  found, places, todo, seen = [], set(), [graph], set()
  while todo:
    current = todo.pop(0)
    if id(current) in seen:
      continue
    seen.add(id(current))
    for op in current.get_operations():
      todo.extend(_called_graphs(op))
      if op.type in _STATEFUL and _place(op) not in places:
        places.add(_place(op))
        found.append(op)
  return found


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


def _user_frame(op):
  """The innermost frame of the code that made `op` outside TensorFlow,
  Keras, dist_keras and Python's own modules, or None."""
  for frame in reversed(getattr(op, "traceback", None) or []):
    if not os.path.abspath(frame.filename).startswith(_LIBRARIES):
      return frame
  return None


def _place(op) -> tuple:
  """Where `op` was made: its user frame's file and line, else its name
  with no replica prefix."""
  frame = _user_frame(op)
  if frame is not None:
    return (frame.filename, frame.lineno)
  return (re.sub(r"^replica_\d+/", "", op.name),)


def _line(where: str, found: list) -> str:
  """The one line naming the first of `found` and the fix."""
  first = found[0]
  tf_call, keras_call = _STATEFUL[first.type]
  frame = _user_frame(first)
  at = (f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
        if frame is not None else f"op {_place(first)[0]!r}")
  more = f"; {len(found) - 1} more" if len(found) > 1 else ""
  return (
      f"{where} draws with {tf_call} ({at}{more}), whose state no "
      "checkpoint keeps: a resumed run draws other numbers, and fit others; "
      f"use {keras_call}(..., seed=self.seed_generator) with a "
      "keras.random.SeedGenerator made in __init__ (checkpointed)")
