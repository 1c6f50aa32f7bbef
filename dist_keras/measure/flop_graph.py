"""FLOPs of a layer's call from its TensorFlow graph.

flops.py's fallback for a call that symbolic inputs cannot run: one written
with TensorFlow ops, or a layer whose sublayers take arguments Keras'
symbolic call does not (keras_hub's TransformerDecoder passes `cache` to its
attention). The call is traced by tf.function on the count's symbolic
shapes (the batch dimension included), and each matmul and convolution of
the graph is sized from its static shapes, as flop_rules.py sizes the
layers and keras.ops: a multiply-add is 2 FLOPs, everything else is 0.

A matmul inside a loop, a condition or a nested function (the graph's
function library) runs an unknown number of times, and the linear algebra
and FFT ops have no rule: the count then says why it cannot size them.
"""
import math

from dist_keras.measure import flop_rules

# TensorFlow ops with matmuls inside: a graph with none of them has no FLOPs.
TF_MATMUL_OPS = {
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
    "SparseMatMul", "SparseTensorDenseMatMul", "_FusedMatMul", "Conv",
    "Conv2D", "Conv3D", "_FusedConv2D", "DepthwiseConv2dNative",
    "Conv2DBackpropInput", "Conv3DBackpropInputV2", "MatrixSolve",
    "MatrixInverse", "MatrixTriangularSolve", "Cholesky", "Qr", "Svd",
    "SelfAdjointEigV2", "Eig", "Lu", "MatrixSolveLs", "FFT", "FFT2D",
    "FFT3D", "IFFT", "IFFT2D", "IFFT3D", "RFFT", "IRFFT", "RFFT2D",
    "IRFFT2D"}


def graph_flops(graph) -> int | str:
  """FLOPs of one run of `graph` (a tf.Graph traced on static shapes), or
  why they are not known."""
  graph_def = graph.as_graph_def()
  hidden = sorted({node.op for function in graph_def.library.function
                   for node in function.node_def} & TF_MATMUL_OPS)
  if hidden:
    return (f"its call has TensorFlow {', '.join(hidden)} ops inside a "
            "loop, a condition or a nested function, which the count "
            "cannot size")
  total, unsized, unknown = 0, set(), set()
  for op in graph.get_operations():
    if op.type not in TF_MATMUL_OPS:
      continue
    rule = _RULES.get(op.type)
    try:
      flops = rule(op) if rule else None
    except flop_rules.UnknownShape:
      unknown.add(op.type)
      continue
    if isinstance(flops, int):
      total += flops
    else:
      unsized.add(op.type)
  if unsized:
    return (f"its call has TensorFlow {', '.join(sorted(unsized))} ops, "
            "which the count cannot size")
  if unknown:
    return (f"its call has TensorFlow {', '.join(sorted(unknown))} ops of "
            "a shape that varies by batch")
  return total


def _matmul(op) -> int:
  """(M, K) x (K, N), either transposed: K multiply-adds per output."""
  k = _dims(op.inputs[0])[0 if op.get_attr("transpose_a") else 1]
  return 2 * k * math.prod(_dims(op.outputs[0]))


def _batch_matmul(op) -> int:
  """(..., M, K) x (..., K, N), either adjoint, batch dimensions
  broadcast: K multiply-adds per element of the (broadcast) output."""
  k = _dims(op.inputs[0])[-2 if op.get_attr("adj_x") else -1]
  return 2 * k * math.prod(_dims(op.outputs[0]))


def _einsum(op) -> int | str:
  return flop_rules.einsum_flops(op.get_attr("equation").decode(),
                                 [_dims(x) for x in op.inputs])


def _conv(op) -> int:
  """Every output element is a dot product of kh x kw (x kd) x the input
  channels (of its group): the filter's dimensions but the last."""
  return 2 * math.prod(_dims(op.outputs[0])) * math.prod(
      _dims(op.inputs[1])[:-1])


def _depthwise(op) -> int:
  """Every output channel sees one input channel: kh x kw per element."""
  return 2 * math.prod(_dims(op.outputs[0])) * math.prod(
      _dims(op.inputs[1])[:2])


def _transposed_conv(op) -> int:
  """A transposed convolution (the gradient of a convolution w.r.t. its
  input: input_sizes, filter, out_backprop) scatters each of its inputs'
  elements through the filter's other dimensions, as flop_rules sizes
  keras' ConvTranspose layers."""
  return 2 * math.prod(_dims(op.inputs[2])) * math.prod(
      _dims(op.inputs[1])[:-1])


_RULES = {"MatMul": _matmul, "BatchMatMul": _batch_matmul,
          "BatchMatMulV2": _batch_matmul, "BatchMatMulV3": _batch_matmul,
          "Einsum": _einsum, "Conv2D": _conv, "Conv3D": _conv,
          "DepthwiseConv2dNative": _depthwise,
          "Conv2DBackpropInput": _transposed_conv,
          "Conv3DBackpropInputV2": _transposed_conv}


def _dims(tensor) -> list:
  dims = tensor.shape.as_list() if tensor.shape.rank is not None else [None]
  if None in dims:
    raise flop_rules.UnknownShape()
  return dims
