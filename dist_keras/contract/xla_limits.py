"""What XLA (train.jit_compile=true) and a TPU cannot take from a user's
model and data, said in one line naming it and the fix.

A TPUStrategy compiles every step with XLA, whatever train.jit_compile
says; train.jit_compile=true compiles the step's forward and backward pass
(the whole step on one device). Keras marks the layers XLA cannot compile
(`supports_jit=False`: StringLookup, TextVectorization, Hashing, the random
image layers, a cuDNN LSTM/GRU), and its compile(jit_compile=True) then
trains without XLA, with a warning; dist_keras follows compile's flag alike
(training/compiled.py) but refuses such a layer where XLA was asked for by
name or by the TPU, before anything is written: it would fail at step 1
with a raw XLA error ("No registered '_Arg' OpKernel"). What no flag marks
(tf.py_function, a sparse input's ops) fails at step 1; that error is
translated here (unsupported_ops). The eval step is XLA-compiled under the
same choice, as fit(jit_compile=True) compiles evaluate's test_step: its
compilation is tried before training (training/evaluation.py), and a
failure said here (eval_refusal). A TPUStrategy also takes no sparse or
ragged batches (TF's distributed input prefetches to the device) and no
pipeline per replica (TF 2.21: NotImplementedError).
"""
import re

import keras
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract import checks
from dist_keras.errors import UserError

# TF's text for an op with no XLA kernel, one per op and node: "No
# registered 'EagerPyFunc' OpKernel for XLA_CPU_JIT devices compatible with
# node {{node functional_1/py_scale_1/EagerPyFunc}}".
_NO_KERNEL = re.compile(r"No registered '(\w+)' OpKernel for (XLA_\w+?)_JIT "
                        r"devices compatible with node \{\{node ([^}]+)\}\}")
_PY_FUNCS = ("EagerPyFunc", "PyFunc", "PyFuncStateless")
# The eval's XLA-compiled function (training/evaluation.py): XLA's errors
# name its graph ("compile graph __inference_eval_test_step_12[...]").
EVAL_FUNCTION = "eval_test_step"
_EVAL_GRAPH = re.compile(rf"compile graph __inference_{EVAL_FUNCTION}_")
# A lowering to HLO that failed (tf.function.experimental_get_compiler_ir).
_NOT_LOWERED = "Failed getting HLO text"


def _asked_by(on_tpu: bool, step: str = "train") -> str:
  """What compiles the step with XLA, as a message starts."""
  if on_tpu:
    return "a TPUStrategy compiles every step with XLA"
  if step == "eval":
    return ("train.jit_compile=true compiles the eval step with XLA (as "
            "Keras' fit(jit_compile=True) compiles evaluate's test_step)")
  return "train.jit_compile=true compiles the train step with XLA"


def check_layers(model, layers: list, jit_compile: bool,
                 on_tpu: bool) -> None:
  """Raises UserError for a layer of `model` Keras marks supports_jit=False
  when its step is XLA-compiled (`jit_compile`, or `on_tpu`). `layers`:
  those inside the model (installation.layers_in).

  Raises:
    UserError: naming the layer, its class, why and the fix.
  """
  if not (jit_compile or on_tpu):
    return
  flagged = []
  for layer in layers:
    # A flagged layer's own sublayers (TextVectorization's StringLookup)
    # go with it.
    if not getattr(layer, "supports_jit", True) and not any(
        layer in installation.layers_in(outer, include_self=False)
        for outer in flagged):
      flagged.append(layer)
  if not flagged:
    return
  layer, more = flagged[0], flagged[1:]
  others = (f" (and {len(more)} more: "
            f"{', '.join(repr(m.name) for m in more)})" if more else "")
  if hasattr(layer, "use_cudnn"):
    fix = "build it with use_cudnn=False"
  else:
    fix = "apply it in dataset_fn (ds.map(layer)) before the model"
  if not on_tpu:
    fix += ", or set train.jit_compile=false"
  raise UserError(
      f"{_asked_by(on_tpu)}, and layer {layer.name!r} "
      f"({type(layer).__name__}){others} of model {model.name!r} cannot be "
      f"compiled by XLA (Keras marks it supports_jit=False); {fix}.")


def check_own_step(model, strategy, jit_compile: bool) -> None:
  """Raises UserError for XLA over a model's own train_step under a
  multi-device strategy: XLA cannot compile its optimizer's update across
  devices (merge_call)."""
  if not (jit_compile and checks.overrides(model, "train_step")):
    return
  if not isinstance(strategy, (tf.distribute.OneDeviceStrategy,
                               tf.distribute.TPUStrategy)):
    raise UserError(
        f"train.jit_compile=true with {type(model).__name__}'s own "
        "train_step under a multi-device strategy: XLA cannot compile its "
        "optimizer's cross-device update (merge_call); use one device or a "
        "TPU, or set train.jit_compile=false.")


def check_tpu_pipelines(per_replica_pipelines: bool, on_tpu: bool) -> None:
  """Raises UserError for data.pipeline_per_replica=true on a TPU, which
  TensorFlow's TPUStrategy does not implement (one pipeline per host)."""
  if per_replica_pipelines and on_tpu:
    raise UserError(
        "data.pipeline_per_replica=true under a TPUStrategy: TensorFlow's "
        "TPUStrategy feeds its replicas from one input pipeline per host "
        "(a pipeline per replica is not implemented there); set "
        "data.pipeline_per_replica=false.")


def check_tpu_batches(element_spec, split: str, on_tpu: bool) -> None:
  """Raises UserError for a sparse or ragged part of a batch on a TPU: its
  distributed dataset prefetches the batches to the TPU, which takes dense
  tensors only (and XLA compiles no sparse op)."""
  if not on_tpu:
    return
  for path, spec in _flat_with_paths(element_spec):
    kind = ("sparse" if isinstance(spec, tf.SparseTensorSpec) else
            "ragged" if isinstance(spec, tf.RaggedTensorSpec) else None)
    if kind:
      raise UserError(
          f"dataset_fn({split!r}, ...) gives a {kind} batch part ({path}: "
          f"{type(spec).__name__}) under a TPUStrategy, which takes dense "
          "batches only; pad or densify it in dataset_fn (ragged: "
          "x.to_tensor() or ds.padded_batch; sparse: tf.sparse.to_dense).")


def _flat_with_paths(element_spec):
  """(path, spec) of each part of a batch's spec: 'x', 'y[0]', 'x/ids'."""
  names = ("x", "y", "sample_weight")
  if isinstance(element_spec, tuple):
    parts = zip(names, element_spec)
  else:
    parts = [("x", element_spec)]
  for name, part in parts:
    for path, spec in keras.tree.flatten_with_path(part):
      yield "/".join([name, *map(str, path)]), spec


def unsupported_ops(error: Exception, on_tpu: bool) -> UserError | None:
  """The UserError for XLA's refusal of ops it has no kernel for, at a
  step (a tf.py_function or tf.numpy_function layer, a sparse input's
  ops), else None: the ops, their nodes (the layers' path) and the fix."""
  if not isinstance(error, tf.errors.InvalidArgumentError):
    return None
  step = "eval" if _EVAL_GRAPH.search(str(error)) else "train"
  return _no_kernel(str(error), on_tpu, step)


def eval_refusal(error: Exception) -> UserError | None:
  """The UserError for an eval step that XLA failed to compile before
  training (evaluation.check_compiles, train.jit_compile=true): ops with
  no XLA kernel, or another refusal of XLA's, named; None for an error
  that is not XLA's (the eval itself finds it, as it did without XLA)."""
  text = str(error)
  if not isinstance(error, (ValueError, tf.errors.OpError)) or (
      _NOT_LOWERED not in text and not _NO_KERNEL.search(text)):
    return None
  bad = _no_kernel(text, on_tpu=False, step="eval")
  if bad is not None:
    return bad
  why = " ".join(text.replace(_NOT_LOWERED, "").strip(" :'").split())[:300]
  return UserError(
      f"{_asked_by(False, 'eval')}, and XLA cannot compile it ({why}); "
      "move that computation into dataset_fn, or set "
      "train.jit_compile=false.")


def _no_kernel(text: str, on_tpu: bool, step: str) -> UserError | None:
  """The line for the ops with no XLA kernel that `text` names, else
  None."""
  found = list(dict.fromkeys(
      (op, node) for op, _, node in _NO_KERNEL.findall(text)))
  if not found:
    return None
  ops = sorted({op for op, _ in found})
  nodes = ", ".join(node for _, node in found[:3])
  nodes += f" and {len(found) - 3} more" if len(found) > 3 else ""
  if any(op in _PY_FUNCS for op in ops):
    fix = "run the Python function in dataset_fn (ds.map) instead"
  elif any(op.startswith("Sparse") for op in ops):
    fix = "densify the sparse input in dataset_fn (tf.sparse.to_dense)"
  else:
    fix = "move that computation into dataset_fn"
  if not on_tpu:
    fix += ", or set train.jit_compile=false"
  return UserError(
      f"{_asked_by(on_tpu, step)}, and XLA has no kernel for op(s) "
      f"{', '.join(ops)} (at node {nodes}: the model's layers, then the "
      f"op); {fix}.")
