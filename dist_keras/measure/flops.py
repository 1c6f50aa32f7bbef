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

Layers are found through the model's functional graph, so every call of a
shared layer counts and nested models (Sequential or functional, e.g.
keras.applications.ResNet50) are recursed into. A layer this module does not
know is counted as 0 and LISTED in `FlopCount.uncounted`, never dropped
silently; so is one whose shapes are not known (a None sequence length).

`profiler_forward_flops` counts the same forward pass from the TensorFlow
graph instead (TF's own per-op FLOP statistics), as a cross-check.
"""
import dataclasses
import math

import keras
import tensorflow as tf

from dist_keras import quiet

# Gate matrices per recurrent cell: each gate multiplies [x_t, h_{t-1}].
RNN_GATES = {keras.layers.LSTM: 4, keras.layers.GRU: 3,
             keras.layers.SimpleRNN: 1}

_CONVS = tuple(getattr(keras.layers, name) for name in (
    "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D",
    "SeparableConv1D", "SeparableConv2D"))
_TRANSPOSED_CONVS = tuple(getattr(keras.layers, name) for name in (
    "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"))

# Counted as 0 on purpose (see the module docstring): no matmul inside.
# Names missing from this Keras version are skipped.
_NO_MATMUL_NAMES = (
    "InputLayer", "Embedding",
    # Activations.
    "Activation", "ReLU", "LeakyReLU", "PReLU", "ELU", "Softmax",
    # Normalisation.
    "BatchNormalization", "LayerNormalization", "GroupNormalization",
    "UnitNormalization", "RMSNormalization",
    # Pooling.
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D",
    "AveragePooling2D", "AveragePooling3D", "GlobalMaxPooling1D",
    "GlobalMaxPooling2D", "GlobalMaxPooling3D", "GlobalAveragePooling1D",
    "GlobalAveragePooling2D", "GlobalAveragePooling3D",
    # Merging.
    "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum",
    "Concatenate",
    # Reshaping.
    "Flatten", "Reshape", "Permute", "RepeatVector", "Cropping1D",
    "Cropping2D", "Cropping3D", "ZeroPadding1D", "ZeroPadding2D",
    "ZeroPadding3D", "UpSampling1D", "UpSampling2D", "UpSampling3D",
    "Identity",
    # Regularisation.
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
    "GaussianDropout", "GaussianNoise", "AlphaDropout", "ActivityRegularization",
    # Elementwise preprocessing.
    "Rescaling", "Normalization", "CenterCrop", "Resizing",
)
_NO_MATMUL = tuple(getattr(keras.layers, name) for name in _NO_MATMUL_NAMES
                   if hasattr(keras.layers, name))


@dataclasses.dataclass
class FlopCount:
  """FLOPs of one example through a model (multiply-add = 2 FLOPs).

  Attributes:
    forward: forward-pass FLOPs per example.
    uncounted: layers counted as 0 because their cost is not known here,
      each as 'path/name (Class): why'. Empty when the count is complete.
  """
  forward: int = 0
  uncounted: list[str] = dataclasses.field(default_factory=list)

  @property
  def training(self) -> int | None:
    """Forward + backward per example: 3 x forward (see the module doc);
    None when nothing could be counted (a subclassed model's layers have no
    known shapes): unknown, not 0."""
    return 3 * self.forward if self.known else None

  @property
  def known(self) -> bool:
    return bool(self.forward or not self.uncounted)


def count(model: keras.Model) -> FlopCount:
  """Analytic FLOPs per example of a built functional/Sequential `model`."""
  result = FlopCount()
  _count_model(model, "", result)
  return result


def _graph_nodes(model):
  """The nodes of `model`'s functional graph, or None (subclassed models).

  Keras keeps no public list of a graph's calls; `_nodes_by_depth` is the
  one Functional uses itself. A Sequential holds its graph in `_functional`
  once built.
  """
  graph = model if hasattr(model, "_nodes_by_depth") else getattr(
      model, "_functional", None)
  if graph is None:
    return None
  return [node for depth in sorted(graph._nodes_by_depth, reverse=True)  # pylint: disable=protected-access
          for node in graph._nodes_by_depth[depth]]  # pylint: disable=protected-access


def _count_model(model, prefix: str, result: FlopCount) -> None:
  nodes = _graph_nodes(model)
  if nodes is None:
    result.uncounted.append(
        f"{prefix.rstrip('/') or model.name} ({type(model).__name__}): not a "
        "functional or built Sequential model, so its layers' shapes are "
        "unknown")
    return
  for node in nodes:
    layer = node.operation
    name = f"{prefix}{layer.name}"
    if isinstance(layer, keras.Model):
      _count_model(layer, f"{name}/", result)
      continue
    in_shapes = [tuple(t.shape) for t in node.input_tensors]
    out_shapes = [tuple(t.shape) for t in keras.tree.flatten(node.outputs)]
    flops = _layer_flops(layer, in_shapes, out_shapes)
    if isinstance(flops, str):
      result.uncounted.append(f"{name} ({type(layer).__name__}): {flops}")
    else:
      result.forward += flops


def _layer_flops(layer, in_shapes, out_shapes):
  """Forward FLOPs per example of one call, or a string saying why not."""
  if isinstance(layer, keras.layers.Bidirectional):
    return _sum_or_reason(_layer_flops(part, in_shapes, out_shapes)
                          for part in (layer.forward_layer,
                                       layer.backward_layer))
  if isinstance(layer, keras.layers.TimeDistributed):
    steps = in_shapes[0][1]
    inner = _layer_flops(layer.layer, [(None, *in_shapes[0][2:])],
                         [(None, *out_shapes[0][2:])])
    if isinstance(inner, str) or steps is None:
      return inner if isinstance(inner, str) else "unknown number of steps"
    return steps * inner
  if isinstance(layer, _NO_MATMUL):
    return 0
  try:
    if isinstance(layer, keras.layers.Dense):
      return 2 * _size(layer.kernel.shape) * _prod(out_shapes[0][1:-1])
    if isinstance(layer, _CONVS + _TRANSPOSED_CONVS):
      return _conv_flops(layer, in_shapes[0], out_shapes[0])
    for cell, gates in RNN_GATES.items():
      if isinstance(layer, cell):
        return rnn_flops(gates, in_shapes[0][-1], layer.units,
                         in_shapes[0][1])
  except _UnknownShape:
    return "shape not fully known (a None dimension)"
  # Also reached by keras.ops calls in a functional graph (no weights).
  parameters = sum(_size(w.shape) for w in getattr(layer, "weights", ()))
  return (f"unknown layer type with {parameters:,} parameters" if parameters
          else "unknown layer type (no weights)")


def rnn_flops(gates: int, input_dim, units: int, steps) -> int:
  """Forward FLOPs of a recurrent layer over `steps` time steps.

  Per step each gate multiplies [x_t, h_{t-1}] (input_dim + units) by its
  (input_dim + units) x units matrix: gates x (input_dim + units) x units
  multiply-adds. Biases and the gates' elementwise math are left out.
  """
  if input_dim is None or steps is None:
    raise _UnknownShape()
  return 2 * gates * (input_dim + units) * units * steps


def _conv_flops(layer, in_shape, out_shape) -> int:
  """Every kernel weight is one multiply-add per position it visits.

  A conv visits each OUTPUT position (strides and padding are in the
  output shape); a transposed conv scatters from each INPUT position.
  Depthwise and separable kernels follow the same rule, each at the
  output positions.
  """
  kernels = [w for w in (getattr(layer, "kernel", None),
                         getattr(layer, "depthwise_kernel", None),
                         getattr(layer, "pointwise_kernel", None))
             if w is not None]
  shape = in_shape if isinstance(layer, _TRANSPOSED_CONVS) else out_shape
  channels_last = getattr(layer, "data_format", "channels_last") \
      == "channels_last"
  spatial = shape[1:-1] if channels_last else shape[2:]
  return 2 * sum(_size(k.shape) for k in kernels) * _prod(spatial)


class _UnknownShape(Exception):
  pass


def _prod(dims) -> int:
  if any(d is None for d in dims):
    raise _UnknownShape()
  return math.prod(dims)


def _size(shape) -> int:
  return _prod(tuple(shape))


def _sum_or_reason(values):
  values = list(values)
  reasons = [v for v in values if isinstance(v, str)]
  return reasons[0] if reasons else sum(values)


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

