"""FLOPs of one call of a layer or a keras.ops operation, from its shapes.

The rules of measure/flops.py's count (see its docstring for the
convention): matmuls and convolutions only, a multiply-add being 2 FLOPs.
Every rule gets the call's arguments by name and its outputs, with their
FULL shapes (the batch dimension included: flops.py divides by it), and
returns the call's FLOPs, or a string saying why they are not known, or
None: a layer whose type is not known here, whose call flops.py traces.
"""
import math

import keras

# Gate matrices per recurrent cell: each gate multiplies [x_t, h_{t-1}].
# (LSTM, GRU and SimpleRNN are RNN layers of these cells.)
CELL_GATES = {keras.layers.LSTMCell: 4, keras.layers.GRUCell: 3,
              keras.layers.SimpleRNNCell: 1}

_CONVS = tuple(getattr(keras.layers, name) for name in (
    "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D",
    "SeparableConv1D", "SeparableConv2D"))
_TRANSPOSED_CONVS = tuple(getattr(keras.layers, name) for name in (
    "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"))

# Counted as 0 on purpose (see flops.py's docstring): no matmul inside.
# Names missing from this Keras version are skipped. Any other layer is
# traced: what it calls is counted.
_NO_MATMUL_NAMES = (
    "InputLayer", "Embedding", "Masking",
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
    # Preprocessing: elementwise, look-ups, augmentation.
    "Rescaling", "Normalization", "CenterCrop", "Resizing", "StringLookup",
    "IntegerLookup", "TextVectorization", "Hashing", "HashedCrossing",
    "CategoryEncoding", "Discretization", "RandomFlip", "RandomRotation",
    "RandomZoom", "RandomTranslation", "RandomContrast", "RandomCrop",
    "RandomBrightness",
)
_NO_MATMUL = tuple(getattr(keras.layers, name) for name in _NO_MATMUL_NAMES
                   if hasattr(keras.layers, name))

# keras.ops operations with matmuls inside that no rule here sizes: loops
# and conditionals (whatever their functions do), linear algebra, FFTs.
# Every other keras.ops operation is elementwise, a reduction, a reshape
# or a gather: 0.
_UNSIZED_OPS = {"Tensordot", "Inner", "Vdot", "Correlate", "Convolve",
                "CDist", "FFT", "FFT2", "IFFT2", "RFFT", "IRFFT", "STFT",
                "ISTFT", "Map", "Scan", "AssociativeScan", "Switch",
                "WhileLoop", "ForiLoop", "Cond", "VectorizedMap"}

class UnknownShape(Exception):
  pass


def forward(op, arguments: dict, outputs: list):
  """FLOPs of one call of `op`: an int, a reason (str), or None (trace)."""
  try:
    if isinstance(op, keras.layers.Layer):
      return _layer(op, _shape(next(iter(arguments.values()))),
                    _shape(outputs[0]))
    return _operation(op, arguments, [_shape(x) for x in outputs])
  except UnknownShape:
    return ("a None dimension, in the model and in the batches (a length "
            "that varies by batch)")


def _layer(layer, in_shape, out_shape):
  """FLOPs of one call of a layer, from its first input's and output's
  shapes; None for a layer type with no rule here."""
  if isinstance(layer, keras.layers.Bidirectional):
    parts = [_layer(part, in_shape, out_shape)
             for part in (layer.forward_layer, layer.backward_layer)]
    return sum(parts) if all(isinstance(p, int) for p in parts) else (
        "a recurrent layer with no rule inside")
  if isinstance(layer, keras.layers.TimeDistributed):
    steps = in_shape[0] * in_shape[1] if None not in in_shape[:2] else None
    inner = _layer(layer.layer, (steps, *in_shape[2:]),
                   (steps, *out_shape[2:]))
    return "a layer with no rule inside" if inner is None else inner
  if isinstance(layer, _NO_MATMUL):
    return 0
  if isinstance(layer, keras.layers.Dense):
    return 2 * _size(layer.kernel.shape) * _prod(out_shape[:-1])
  if isinstance(layer, _CONVS + _TRANSPOSED_CONVS):
    kernels = [w for w in (getattr(layer, "kernel", None),
                           getattr(layer, "depthwise_kernel", None),
                           getattr(layer, "pointwise_kernel", None))
               if w is not None]
    return conv_flops(kernels, in_shape if isinstance(
        layer, _TRANSPOSED_CONVS) else out_shape, layer.data_format)
  if isinstance(layer, keras.layers.RNN):
    gates = CELL_GATES.get(type(layer.cell))
    if gates is None:  # Its loop hides the cell's calls from a trace.
      return f"a recurrent layer of a {type(layer.cell).__name__} cell"
    return in_shape[0] * rnn_flops(gates, in_shape[-1], layer.cell.units,
                                   in_shape[1])
  return None


def rnn_flops(gates: int, input_dim, units: int, steps) -> int:
  """Forward FLOPs of a recurrent layer over `steps` time steps.

  Per step each gate multiplies [x_t, h_{t-1}] (input_dim + units) by its
  (input_dim + units) x units matrix: gates x (input_dim + units) x units
  multiply-adds. Biases and the gates' elementwise math are left out.
  """
  if input_dim is None or steps is None:
    raise UnknownShape()
  return 2 * gates * (input_dim + units) * units * steps


def conv_flops(kernels, shape, data_format) -> int:
  """Every kernel weight is one multiply-add per position it visits.

  A conv visits each OUTPUT position (strides and padding are in the
  output shape); a transposed conv scatters from each INPUT position: the
  caller passes that shape. Depthwise and separable kernels follow the
  same rule, each at the output positions.
  """
  channels_last = (data_format or keras.config.image_data_format()
                   ) == "channels_last"
  positions = shape[:-1] if channels_last else shape[:1] + shape[2:]
  return 2 * sum(_size(k.shape) for k in kernels) * _prod(positions)


def _operation(op, arguments, out_shapes):
  """FLOPs of one keras.ops call (an operation in a functional graph or in
  a traced layer's call)."""
  kind = type(op).__name__
  if kind in ("Matmul", "Dot"):
    first = _shape(next(iter(arguments.values())))
    return 2 * _prod(first[-1:]) * _prod(out_shapes[0])
  if kind == "Einsum":
    return einsum_flops(op.subscripts,
                        [_shape(x) for x in arguments["operands"]])
  if kind == "DotProductAttention":
    query, key, value = (_shape(arguments[name])
                         for name in ("query", "key", "value"))
    # (B, T, N, H) queries against (B, S, N, H) keys, then the scores
    # against (B, S, N, Hv) values.
    keys = _prod(key[1:2])
    return 2 * keys * (_prod(query) + _prod(query[:-1]) * _prod(value[-1:]))
  if kind in ("Conv", "DepthwiseConv", "SeparableConv", "ConvTranspose"):
    kernels = [v for name, v in arguments.items() if "kernel" in name]
    shape = (_shape(arguments["inputs"]) if kind == "ConvTranspose"
             else out_shapes[0])
    return conv_flops(kernels, shape, op.data_format)
  if kind in _UNSIZED_OPS or type(op).__module__.endswith(".linalg"):
    return f"a keras.ops {kind} operation, whose FLOPs are not counted"
  return 0


def einsum_flops(subscripts: str, shapes: list) -> int | str:
  """2 x the product of every index's size, for two operands with an index
  summed over (each combination of indices is one multiply-add); 0 for one
  operand (a transpose or a sum) or none summed over (an elementwise or
  outer product, a multiply as keras.ops.multiply's). '...' dimensions
  are matched from the right, as they broadcast."""
  inputs, arrow, output = subscripts.replace(" ", "").partition("->")
  terms = inputs.split(",")
  if len(terms) == 1:
    return 0
  if len(terms) != 2 or len(shapes) != 2:
    return "an einsum of more than two operands, whose FLOPs are not counted"
  sizes = {}
  for term, shape in zip(terms, shapes):
    head, _, tail = term.partition("...")
    rest = len(shape) - len(head) - len(tail)
    names = [*head, *(f"...{rest - i}" for i in range(rest)), *tail]
    for name, size in zip(names, shape):
      if size is None:
        raise UnknownShape()
      sizes[name] = max(size, sizes.get(name, 1))
  # Without '->', the output is the indices written once, and the '...'.
  kept = set(output) if arrow else {
      i for i in inputs if inputs.count(i) == 1 or i == "."}
  summed = [name for name in sizes if
            ("." if name.startswith("...") else name) not in kept]
  return 2 * math.prod(sizes.values()) if summed else 0


def _shape(x) -> tuple:
  return tuple(getattr(x, "shape", ()))


def _prod(dims) -> int:
  if any(d is None for d in dims):
    raise UnknownShape()
  return math.prod(dims)


def _size(shape) -> int:
  return _prod(tuple(shape))
