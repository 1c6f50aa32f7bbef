"""The variables a model's training call assigns itself (a counter, a
running mean kept in a layer's `call`), checked at N > 1 replicas before
training, as each replica's assignments combine by the variable's
`aggregation`.

Keras' `assign_add(d)` is `assign(v + d)`; under tf.distribute each
replica assigns its own new value in its step and the variable takes:
- "mean": their mean: one device's for a counter, and for a running mean
  of the batch (the replicas' shares are equal): exact;
- "sum": their sum, N x (v + d): a counter doubles every step at 2
  replicas (8190 after 12 steps, not 12), a running mean of -0.04 reads
  -64 (a TensorFlow `assign_add` adds the replicas' increments: a counter
  counts N a step). Refused, as fit under MirroredStrategy trains it so;
- "none" (Keras' default): each replica keeps its own; "only_first_replica":
  every replica takes replica 0's. A value that does not depend on the
  batch (a counter) is one device's on every replica; one computed from
  the batch is a statistic of a replica's share of it, not of the global
  batch (as BatchNormalization's moving statistics, said in compiled.py),
  which the run says at the start (a checkpoint and model.keras keep
  replica 0's), since fit under MirroredStrategy keeps the same values.
Found by tracing the training call (contract/model_calls.py's forward, as
Keras' train_step calls it) on the train batches' spec and reading its
Assign*VariableOp ops: the variable each assigns, and whether its value
is computed from the batch. An update inside a nested function (a
`tf.cond`, a `tf.function` of its own) is not looked for. Updates in
inference (training=False) are not concerned: the eval's are exact.
"""
import dataclasses

from dist_keras import installation
from dist_keras.contract import model_calls
from dist_keras.errors import UserError
from dist_keras.training import call_losses

_ASSIGNS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
_REPLICA_OWN = ("none", "only_first_replica")


@dataclasses.dataclass(frozen=True)
class Assigned:
  """A variable the traced call assigns.

  Attributes:
    variable: the model's keras.Variable.
    from_batch: whether the value assigned is computed from the batch.
    increment: whether it is assigned by adding to it (a TensorFlow
      assign_add), not a whole new value (Keras' assign and assign_add).
  """
  variable: object
  from_batch: bool
  increment: bool


@dataclasses.dataclass(frozen=True)
class Forward:
  """The model's training call, traced on the train batches' spec.

  Attributes:
    assigned: what it assigns, in the call's order, each variable once.
    losses: how many losses model.losses held after it (add_loss terms,
      regularisers).
    loss_in_call: whether it reduces a keras.losses.Loss (call_losses.py).
    graph: the traced call's graph (random_ops reads its ops there).
  """
  assigned: tuple
  losses: int
  loss_in_call: bool = False
  graph: object = None


def traced(model, layers: list, strategy, batch_spec) -> Forward | None:
  """The model's training call traced on `batch_spec` (not run: no state
  moves), at N > 1 replicas where the model could keep state or losses
  of its own: the model or one of `layers` (those inside it) of a class
  not Keras' own (which may add_loss and assign its variables), or a
  variable of aggregation "sum". None where
  there is none of those (Keras' layers only: no cost) or the call
  cannot be traced on the batches (a GAN's, whose batches are not its
  call's inputs)."""
  if (strategy.num_replicas_in_sync == 1
      or not _worth_tracing(model, layers)):
    return None
  try:
    with call_losses.as_one_device():
      before = call_losses.reductions()
      graph, losses = model_calls.traced(model, strategy, batch_spec, True)
      in_call = call_losses.reductions() > before
  except Exception:  # pylint: disable=broad-except
    return None  # Left as Keras runs it: its own error at its step.
  return Forward(assigned_in(graph, model.variables), losses, in_call, graph)


def _worth_tracing(model, layers: list) -> bool:
  """Whether the model or one of its `layers` is of a class not Keras'
  own, or a variable of aggregation "sum"."""
  return (any(not keras_own(layer) for layer in [model, *layers])
          or any(v.aggregation == "sum" for v in model.variables))


def keras_own(layer) -> bool:
  """Whether `layer`'s class is one of Keras' (keras.src...), not the
  user's (or another library's, as keras_hub's)."""
  return type(layer).__module__.startswith("keras.")


def assigned_in(graph, variables) -> tuple:
  """The Assigned of each of `variables` that an Assign*VariableOp of
  `graph` (a tf.function's) assigns, in their order there."""
  handles = {}
  for variable in variables:
    inner = variable.value
    for component in getattr(inner, "values", (inner,)):  # Mirrored: each.
      handles[id(component.handle)] = variable
  outside = {id(inner): outer for outer, inner in graph.captures}
  found = {}
  for op in graph.get_operations():
    if op.type not in _ASSIGNS:
      continue
    variable = handles.get(id(outside.get(id(op.inputs[0]))))
    if variable is None:
      continue  # Not the model's (a metric's, say).
    before = found.get(id(variable))  # (Paths repeat: seed generators'.)
    found[id(variable)] = Assigned(
        variable,
        (before is not None and before.from_batch)
        or _from_batch(op.inputs[1], outside),
        op.type != "AssignVariableOp")
  return tuple(found.values())


def _from_batch(value, outside: dict) -> bool:
  """Whether `value` is computed from the traced function's inputs (the
  batch), not only from captured variables and constants."""
  seen, todo = set(), [value]
  while todo:
    tensor = todo.pop()
    if id(tensor) in seen or id(tensor) in outside:
      continue  # A captured variable's handle, or a captured constant.
    seen.add(id(tensor))
    if tensor.op.type == "Placeholder":
      return True
    todo.extend(tensor.op.inputs)
  return False


def check(model, layers: list, forward: Forward | None,
          replicas: int) -> str | None:
  """Refuses a variable of aggregation "sum" the training call assigns;
  returns the line for one of "none" or "only_first_replica" of a
  layer not Keras' own (the model, or one of `layers`) that it assigns
  from the batch, or None.

  Raises:
    UserError: a "sum" variable the training call assigns (N > 1).
  """
  if forward is None:
    return None
  for found in forward.assigned:
    if found.variable.aggregation == "sum":
      raise UserError(_summed(found, replicas))
  users = _users_layer_state([model, *layers])
  own = [found.variable for found in forward.assigned
         if found.from_batch and found.variable.aggregation in _REPLICA_OWN
         and id(found.variable) in users]
  if not own:
    return None
  first = own[0]
  kept = ("each replica keeps its own (a checkpoint and model.keras "
          "replica 0's)" if first.aggregation == "none" else
          "every replica takes replica 0's")
  more = f" (and {len(own) - 1} more)" if len(own) > 1 else ""
  return (
      f"variable {first.path!r}{more} (aggregation={first.aggregation!r}) "
      "is assigned from the batch in the model's training call: each of "
      f"the {replicas} replicas computes it from its own share of the "
      f"batch and {kept}, not one device's value over the global batch, "
      "as under fit with MirroredStrategy; create it with "
      "aggregation=\"mean\" for one device's (the replicas' mean of equal "
      "shares)")


def _summed(found: Assigned, replicas: int) -> str:
  """The refusal of a "sum" variable the training call assigns."""
  variable = found.variable
  grows = "doubles" if replicas == 2 else f"grows {replicas}-fold"
  if found.increment:
    what = (f"the {replicas} replicas' increments add up (a counter of "
            f"assign_add(1) counts {replicas} a step)")
  else:
    what = (f"each of the {replicas} replicas assigns its own new value "
            f"and the variable takes their sum (a counter of assign_add(1)"
            f" {grows} every step: {replicas} x (count + 1); a running "
            "mean, the sum of the replicas' means)")
  return (
      f"variable {variable.path!r} has aggregation=\"sum\" and the model's "
      f"training call assigns it: {what}, so {replicas} replicas cannot "
      "keep what one device keeps; create it with aggregation=\"mean\" "
      "(the replicas' mean: one device's counter or running mean), count "
      "in a callback on the host, or train on one replica "
      "(runtime.strategy=one_device); " + installation.see_docs(
          "own_models.md", "what is refused",
          "Python API: your own model and data") + ".")


def _users_layer_state(layers: list) -> set:
  """The ids of the variables held by one of `layers` of a class not
  Keras' own (its innermost holder): Keras' layers keep theirs per replica by
  design (a seed generator's state, drawn per replica in replica_seeds.py;
  a stateful RNN's) or are said already (BatchNormalization, in
  compiled.py)."""
  holder = {}
  for layer in layers:
    for variable in layer.variables:
      known = holder.get(id(variable))
      if known is None or len(layer.variables) < len(known.variables):
        holder[id(variable)] = layer
  return {key for key, layer in holder.items() if not keras_own(layer)}
