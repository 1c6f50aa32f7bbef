"""The model called as Keras' train_step and test_step call it: the
training steps (training/steps.py), the probe of the model against its
batches before training (probe.py) and the checks that trace a step
(training/varying_slices.py) all call it so, hence alike."""
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


def traced(model, strategy, batch_spec, training: bool):
  """(the graph, the count of model.losses after it) of `forward` traced,
  not run (no state moves), in `strategy`'s scope on batches like
  `batch_spec`, where Keras' steps find add_loss terms and regularisers.
  Raises what tracing raises (a call that cannot take the batches' x)."""
  x, _, _ = keras.utils.unpack_x_y_sample_weight(batch_spec)
  found = []

  def call(x):
    forward(model, x, training=training)
    found.append(len(model.losses))

  with strategy.scope(), installation.keras_name_scopes_kept():
    function = tf.function(call, autograph=False).get_concrete_function(x)
  return function.graph, found[-1]
