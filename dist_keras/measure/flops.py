"""Model FLOPs per example, counted analytically from a built Keras model.

Convention (the one MFU is defined with: Kaplan et al. 2020, "Scaling laws",
and PaLM's MFU, Chowdhery et al. 2022, appendix B):
  * Only matrix multiplies and convolutions count, a multiply-add being 2
    FLOPs. Biases, activations, gate nonlinearities, normalisation, pooling,
    residual adds and embedding look-ups (a gather) count 0: they are
    memory-bound, a few % of a conv net's FLOPs at most, and leaving them out
    keeps the number the same as everyone else's (ResNet-50: ~4.1 GMACs).
  * Training = 3 x forward: the backward pass costs two matmuls per forward
    matmul (gradients w.r.t. the activations and w.r.t. the weights). It
    slightly over-counts the first layer (no input gradient is needed), as
    the convention does.

The model's functional graph is run on symbolic inputs of BATCH examples
(each call's shapes worked out by Keras), every call counted by
flop_rules.py: every call of a shared layer counts, nested models are
recursed into, and a dimension the model leaves None (a sequence length)
is the one the batches have when their spec is given. A layer with no rule
(a custom layer, MultiHeadAttention, a Lambda) is traced: its `call` is run
on symbolic inputs and the layers and keras.ops it calls are counted; so is
a subclassed model's call, given the batches' spec. A call symbolic inputs
cannot run (TensorFlow ops, keras_hub's transformer layers) is counted
from its TensorFlow graph (flop_graph.py). Whatever cannot be counted (a
matmul in a TensorFlow loop, a linear-algebra op, a None dimension the
batches do not fill) is LISTED in `FlopCount.uncounted`, and the count is
then unknown, never a partial figure.

`profiler_forward_flops` counts the same forward pass from the TensorFlow
graph instead (TF's own per-op FLOP statistics), as a cross-check.
"""
import contextlib
import dataclasses
import inspect

import keras
import tensorflow as tf

from dist_keras import errors, installation, quiet
from dist_keras.measure import flop_graph
from dist_keras.measure import flop_rules

rnn_flops = flop_rules.rnn_flops

# The batch every count runs at: the FLOPs of the whole batch, divided by
# it, so that a call folding the batch into another dimension
# (keras.ops.reshape(x, (-1, d)) before a Dense) still counts every row.
BATCH = 2


@dataclasses.dataclass
class FlopCount:
  """FLOPs of one example through a model (multiply-add = 2 FLOPs).

  Attributes:
    forward: forward-pass FLOPs per example (of the calls counted).
    uncounted: calls whose FLOPs are not known, each as
      'path/name (Class): why'. Empty when the count is complete.
  """
  forward: int = 0
  uncounted: list[str] = dataclasses.field(default_factory=list)

  @property
  def training(self) -> int | None:
    """Forward + backward per example: 3 x forward (see the module doc);
    None when anything could not be counted: unknown, not a part."""
    return 3 * self.forward if self.known else None

  @property
  def known(self) -> bool:
    return not self.uncounted


def count(model: keras.Model, batch_spec=None) -> FlopCount:
  """Analytic FLOPs per example of a built `model`.

  Args:
    model: a functional or built Sequential model; a subclassed one is
      counted only with `batch_spec`.
    batch_spec: the element spec of the train batches, (x, y[, weights])
      or x alone, or None: the model's own input shapes.
  """
  batch_x = None if batch_spec is None else (
      keras.utils.unpack_x_y_sample_weight(batch_spec)[0])
  counter = _Counter()
  graph = _graph(model)
  # A count never stops a run: what it cannot do is listed. (A layer named
  # '_...' fails its trace and would stay on Keras' scope stack.)
  try:
    with installation.keras_name_scopes_kept():
      if graph is not None:
        counter.walk(graph, _inputs(graph.inputs, batch_x), "")
      elif type(model).call is keras.Model.call:
        # keras.io's VAE and GANs: their own train_step calls their parts.
        counter.skip(model.name, model, "no call() of its own to count")
      elif batch_x is None:
        counter.skip(model.name, model, "a subclassed model, with no batch "
                     "to trace its call on")
      else:
        counter.count_call(model, (_symbolic(batch_x),), {}, "")
  except Exception as error:  # pylint: disable=broad-except
    counter.skip(model.name, model, f"the count failed ({_short(error)})")
  return FlopCount(counter.total // BATCH, counter.uncounted)


class _Counter:
  """FLOPs of a whole batch, summed over every call it is shown."""

  def __init__(self):
    self.total, self.uncounted = 0, []

  def skip(self, name: str, op, why: str) -> None:
    self.uncounted.append(f"{name} ({type(op).__name__}): {why}")

  def walk(self, graph, inputs: list, prefix: str) -> list:
    """Runs `graph` (a Functional or keras.Function) on symbolic `inputs`,
    counting each call; returns its outputs (None: not worked out)."""
    tensors = {id(x): y for x, y in zip(graph.inputs, inputs)}
    for node in _graph_nodes(graph):
      if node.is_input or any(id(x) not in tensors
                              for x in node.input_tensors):
        continue  # Downstream of a call that failed (and is listed).
      args, kwargs = node.arguments.fill_in(tensors)
      outputs = self.count_call(node.operation, args, kwargs, prefix)
      for x, y in zip(node.outputs, keras.tree.flatten(outputs)):
        if y is not None:
          tensors[id(x)] = y
    return [tensors.get(id(x)) for x in graph.outputs]

  def count_call(self, op, args, kwargs, prefix: str):
    """Counts one call of `op` (a layer, model or keras.ops operation) on
    symbolic arguments; returns its symbolic outputs ([]: unknown)."""
    name = f"{prefix}{op.name}"
    try:
      arguments = inspect.signature(op.call).bind(*args, **kwargs).arguments
      graph = _graph(op) if isinstance(op, keras.Model) else None
      if graph is not None:
        inputs = keras.tree.flatten(next(iter(arguments.values())))
        return self.walk(graph, inputs, f"{name}/")
      outputs = op.compute_output_spec(*args, **kwargs)
    except Exception as error:  # pylint: disable=broad-except
      self.skip(name, op, f"its output shape could not be worked out "
                f"({_short(error)})")
      return []
    outputs = keras.tree.flatten(outputs)
    flops = flop_rules.forward(op, arguments, outputs)
    if flops is None:
      flops, traced = self.trace(op, args, kwargs, f"{name}/")
      # The traced call's shapes: a layer's own output spec may leave
      # dimensions None that its call fills (EinsumDense's).
      if len(traced) == len(outputs):
        outputs = [t if t is not None else o for t, o in zip(traced, outputs)]
    if isinstance(flops, str):
      self.skip(name, op, flops)
    else:
      self.total += flops
    return outputs

  def trace(self, op, args, kwargs, prefix: str) -> tuple:
    """(FLOPs or why not, outputs) of a call of a layer with no rule: its
    `call` run on symbolic inputs, each layer and keras.ops operation it
    calls counted. A call symbolic inputs cannot run (TensorFlow ops) is
    counted from its TensorFlow graph instead."""
    flat = [keras.Input(batch_shape=x.shape, dtype=x.dtype)
            if isinstance(x, keras.KerasTensor) else x
            for x in keras.tree.flatten((args, kwargs))]
    call_args, call_kwargs = keras.tree.pack_sequence_as((args, kwargs), flat)
    inputs = [x for x in flat if isinstance(x, keras.KerasTensor)]
    inner = _Counter()
    try:
      with _untouched(op):
        graph = keras.Function(inputs, op.call(*call_args, **call_kwargs))
        outputs = inner.walk(graph, inputs, prefix)
    except Exception as error:  # pylint: disable=broad-except
      return _tf_graph_flops(op, args, kwargs, error), []
    self.uncounted += inner.uncounted
    return inner.total, outputs


def _tf_graph_flops(op, args, kwargs, error) -> int | str:
  """FLOPs of `op`'s call traced as a TensorFlow graph on the same shapes
  (flop_graph.py sizes its matmuls and convolutions), or why not known."""
  specs = keras.tree.map_structure(
      lambda x: tf.TensorSpec(x.shape, x.dtype)
      if isinstance(x, keras.KerasTensor) else x, (args, kwargs))
  try:
    with _untouched(op):
      graph = tf.function(lambda a, k: op.call(*a, **k)).get_concrete_function(
          *specs).graph
  except Exception:  # pylint: disable=broad-except
    return f"its call could not be traced ({_short(error)})"
  return flop_graph.graph_flops(graph)


@contextlib.contextmanager
def _untouched(op):
  """Leaves the user's layers as they were after a trace of `op`: the node
  (Keras' record of a symbolic call) it adds to each layer `op` calls is
  dropped, and variable updates and add_loss go to a throwaway scope."""
  layers = (installation.layers_in(op, include_self=True)
            if isinstance(op, keras.layers.Layer) else [])
  kept = [(layer, len(layer._inbound_nodes), len(layer._outbound_nodes))  # pylint: disable=protected-access
          for layer in layers]
  try:
    with keras.StatelessScope():
      yield
  finally:
    for layer, inbound, outbound in kept:
      del layer._inbound_nodes[inbound:]  # pylint: disable=protected-access
      del layer._outbound_nodes[outbound:]  # pylint: disable=protected-access


def _graph(model):
  """`model`'s functional graph (itself, or a built Sequential's), or None
  (a subclassed model)."""
  return model if hasattr(model, "_nodes_by_depth") else getattr(
      model, "_functional", None)


def _graph_nodes(graph):
  """The calls of a graph, inputs first. Keras keeps no public list of a
  graph's calls; `_nodes_by_depth` is the one Functional uses itself."""
  return [node for depth in sorted(graph._nodes_by_depth, reverse=True)  # pylint: disable=protected-access
          for node in graph._nodes_by_depth[depth]]  # pylint: disable=protected-access


def _inputs(own: list, batch_x) -> list:
  """Symbolic inputs like a graph's `own`, of BATCH examples, with the
  dimensions `own` leaves None taken from the batches' spec if it fits."""
  specs = keras.tree.flatten(batch_x) if batch_x is not None else []
  if len(specs) != len(own) or any(
      _dims(s) is None or len(_dims(s)) != len(x.shape)
      for s, x in zip(specs, own)):
    specs = own
  return [keras.KerasTensor(
      (BATCH, *(a if a is not None else b
                for a, b in zip(x.shape[1:], _dims(s)[1:]))), dtype=x.dtype)
          for x, s in zip(own, specs)]


def _symbolic(batch_x):
  """Symbolic inputs of BATCH examples shaped as the batches' spec."""
  return keras.tree.map_structure(
      lambda s: keras.KerasTensor((BATCH, *_dims(s)[1:]), dtype=s.dtype.name),
      batch_x)


def _dims(x) -> tuple | None:
  try:
    return tuple(x.shape)
  except (TypeError, ValueError):  # A shape of unknown rank.
    return None


def _short(error: Exception) -> str:
  return f"{type(error).__name__}: {errors.first_line(error, 160)}"


def profiler_forward_flops(model: keras.Model) -> int:
  """Forward FLOPs per example as TensorFlow's profiler counts them.

  Traces `model` on one example (batch 1, inference mode) and sums TF's
  registered per-op FLOP statistics over the graph: MatMul and Conv2D as
  2 x multiply-adds, like `count`, but also BiasAdd, the elementwise ops
  (batch-norm arithmetic, residual adds) and pooling, which `count` leaves
  out; a loop body (an RNN's while loop) is not counted. For loop-free
  models the two should agree within a few %.
  """
  specs = [tf.TensorSpec((1, *t.shape[1:]), t.dtype) for t in model.inputs]
  graph = tf.function(lambda *x: model(list(x) if len(x) > 1 else x[0],
                                       training=False)
                      ).get_concrete_function(*specs).graph
  builder = tf.compat.v1.profiler.ProfileOptionBuilder
  options = builder(builder.float_operation()).with_empty_output().build()
  with quiet.tf_warnings_off():  # The profiler warns about its own v1 helpers.
    profile = tf.compat.v1.profiler.profile(graph=graph, options=options,
                                            cmd="scope")
  return int(profile.total_float_ops)

