"""The model called as Keras' train_step and test_step call it: the
training steps (training/steps.py), the probe of the model against its
batches before training (probe.py) and the checks that trace a step
(training/varying_slices.py, training/state_updates.py) all call it so,
hence alike. What the probe asks of a call is here too (the prediction's
shapes, the targets of batches without labels, whether the call adds
losses of its own): the probe calls in, nothing here calls the probe."""
import inspect

import keras
import tensorflow as tf

from dist_keras import installation


def forward(model, x, training: bool):
  """`model(x)` as Keras' train_step and test_step call it: `training`
  passed only to a call that takes it (a call without it runs as written;
  forcing training=True turned its Dropout on where fit's was off)."""
  if getattr(model, "_call_has_training_arg", True):
    return model(x, training=training)
  return model(x)


def compute_loss(model, x, y, y_pred, sample_weight, training: bool):
  """`model.compute_loss`: the compiled loss plus the model's own losses
  (regularisers), scaled by Keras for `tf.distribute` so that a SUM
  all-reduce of the replicas' gradients is the one-device gradient.

  Overrides written before Keras 3.3 take no `training` argument.
  """
  if "training" in inspect.signature(model.compute_loss).parameters:
    return model.compute_loss(x=x, y=y, y_pred=y_pred,
                              sample_weight=sample_weight, training=training)
  return model.compute_loss(x=x, y=y, y_pred=y_pred,
                            sample_weight=sample_weight)


def traced_forward(model, x, training: bool):
  """`forward` in a tf.function traced to read what the call does, inside
  a name scope: at a graph's outermost scope TensorFlow refuses a scope
  named with a leading '_' (a class `_Net`'s "__net"), which says nothing
  of the call. Keras' train_step calling it so is refused before
  (traced_limits.check); a train_step of the model's own may call it
  inside a scope (fit trains it then) or at the root (refused at step 1:
  traced_limits.fault), so the checks read its call either way."""
  with tf.name_scope("dist_keras_check"):
    return forward(model, x, training=training)


def traced(model, strategy, batch_spec, training: bool):
  """(the graph, the count of model.losses after it) of `forward` traced,
  not run (no state moves), in `strategy`'s scope on batches like
  `batch_spec`, where Keras' steps find add_loss terms and regularisers.
  Raises what tracing raises (a call that cannot take the batches' x)."""
  x, _, _ = keras.utils.unpack_x_y_sample_weight(batch_spec)
  found = []

  def call(x):
    traced_forward(model, x, training)
    found.append(len(model.losses))

  with strategy.scope(), installation.keras_name_scopes_kept():
    function = tf.function(call, autograph=False).get_concrete_function(x)
  return function.graph, found[-1]


def adds_losses(model, strategy, batch_spec, training: bool):
  """Whether model.losses holds any loss after the model's call on batches
  like `batch_spec`, where Keras' train_step and test_step find add_loss
  terms and regularisers; None if the call cannot take the batches' x (a
  GAN's real samples). The call is traced, not run: no state moves."""
  try:
    return bool(traced(model, strategy, batch_spec, training)[1])
  # NotImplementedError: a model without call() (keras.io's VAE).
  except (ValueError, TypeError, NotImplementedError,
          tf.errors.InvalidArgumentError):
    return None


def shaped_by_inputs(model, batch_spec):
  """`batch_spec` with the sizes its x leaves open (None past the batch:
  keras.utils.timeseries_dataset_from_array's window length) taken from
  the model's own Inputs where they state them, so that a zero batch of it
  (probe.py) has the shape the model takes, as the real batches have;
  sizes the Inputs leave open too stay open (the zero batch's 1)."""
  x = keras.utils.unpack_x_y_sample_weight(batch_spec)[0]
  try:
    own = model.input if isinstance(model.input, dict) else model.inputs
  except (AttributeError, ValueError):  # Subclassed, or not yet built.
    return batch_spec
  if isinstance(x, dict) and isinstance(own, dict) and set(x) <= set(own):
    x = {key: _filled(spec, own[key]) for key, spec in x.items()}
  elif not isinstance(x, dict) and len(tf.nest.flatten(x)) == len(own):
    x = tf.nest.pack_sequence_as(x, [
        _filled(spec, tensor) for spec, tensor in
        zip(tf.nest.flatten(x), own)])
  else:
    return batch_spec
  if isinstance(batch_spec, (tuple, list)):
    return (x, *batch_spec[1:])
  return x


def _filled(spec, tensor):
  """A dense `spec` with its open sizes past the batch taken from the
  KerasTensor `tensor` of the same rank; any other spec as it is."""
  if (not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None
      or spec.shape.rank != len(tensor.shape)):
    return spec
  dims = [d if d is not None or i == 0 else tensor.shape[i]
          for i, d in enumerate(spec.shape.as_list())]
  return tf.TensorSpec(dims, spec.dtype, spec.name)


def zero_prediction(model, x):
  """What the model returns for `x`, as zeros of its shapes.

  The shapes come from Keras' shape inference, symbolically, as Keras' fit
  builds a model: the call runs on no values, so state it updates (a
  counter, a running mean) moves only in the steps, as under fit. A model
  not yet built is called on symbolic inputs, which creates its weights
  (running it eagerly also cost the default LSTM 0.3 s before the first
  step). A model whose inference fails is called, to raise the real error.
  """
  symbolic = tf.nest.map_structure(
      lambda t: keras.KerasTensor(t.shape, t.dtype), x)
  try:
    # (Keras' inference traces the call in a graph of its own, where a
    # layer named '_...' is refused and would stay on Keras' scope stack.)
    with installation.keras_name_scopes_kept():
      if model.built:  # Inference also builds the layers its call builds.
        spec = model.compute_output_spec(symbolic)
      else:
        spec = forward(model, symbolic, training=False)
    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)
  except Exception:  # pylint: disable=broad-except
    pass  # The call below says what is wrong, or works.
  return forward(model, x, training=False)


def targets(y, y_pred):
  """The labels a compiled loss and metrics are built from: the batch's;
  for batches without labels (read only by a model's own step: an
  autoencoder's, which compares its prediction with its x), zeros shaped
  like the prediction."""
  if y is not None:
    return y
  return tf.nest.map_structure(tf.zeros_like, y_pred)
