"""training/keras_internals.py: every private part of Keras and TensorFlow
dist_keras relies on, each checked directly, in seconds.

None of these names is API: a Keras (or TensorFlow) release may move,
rename or change any of them without notice. dist_keras then trains
silently wrong (gradients reduced twice, a schedule read at the wrong step,
per-output eval losses weighed wrong) or fails deep inside a traced step,
which the end-to-end tests (test_fit_parity.py, test_equivalence.py) show
only minutes later and without naming the cause. Each test here fails on
its own, naming the private name it guards; run this file first after
upgrading Keras or TensorFlow.
"""
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import helpers
from dist_keras import installation, models, validate
from dist_keras.training import allreduce, keras_internals, metrics
from dist_keras.training import sparse_grads

MODULE = "dist_keras/training/keras_internals.py"


def _replica_grad():
  """Replica r's gradient: r + 1 everywhere, so 2 replicas sum to 3 (a mean
  would be 1.5, a sum taken twice 6)."""
  r = tf.distribute.get_replica_context().replica_id_in_sync_group
  return tf.fill([3], tf.cast(r, tf.float32) + 1.0)


def _built(scope, make_optimizer):
  """A 3-float variable at zero and an optimizer built on it, in `scope`."""
  with scope:
    var = keras.Variable(np.zeros(3, np.float32))
    optimizer = make_optimizer()
    optimizer.build([var])
  return var, optimizer


def _one_device(make_optimizer, grad: float, steps: int = 1):
  """The variable and optimizer after `steps` applies of `grad` on one
  device: what 2 replicas must end with."""
  var, optimizer = _built(tf.name_scope("one_device"), make_optimizer)
  for _ in range(steps):
    optimizer.apply_gradients([(tf.fill([3], grad), var)])
  return var, optimizer


def _assert_replicas_equal(strategy, pairs):
  """Every replica's copy of each distributed variable equals its one-device
  counterpart."""
  for got, want in pairs:
    for value in strategy.experimental_local_results(got.value):
      np.testing.assert_allclose(value, want.numpy(), rtol=1e-6,
                                 err_msg=got.path)


@pytest.mark.parametrize("name", validate.OPTIMIZERS)
def test_each_optimizer_applies_the_reduced_gradient_once(name, mirrored):
  """Fails if a Keras release moves the optimizer's own all-reduce out of
  the hook dist_keras disables (`_all_reduce_sum_gradients`): under
  Mirrored, 2 replicas' all-reduced ones must update the weights AND the
  optimizer's slots exactly as one device applying the sum (2) does. Summed
  again by Keras, they would see 4 (Adam's first step hides that in the
  weights, not in its moments)."""
  def make(scope):
    with scope:
      var = keras.Variable(np.zeros(3, np.float32))
      optimizer = models.make(name, learning_rate=0.1)
      optimizer.build([var])
    return var, optimizer

  var_ref, ref = make(tf.name_scope("one_device"))
  ref.apply_gradients([(tf.fill([3], 2.0), var_ref)])
  var, optimizer = make(mirrored.scope())
  keras_internals.disable_optimizer_allreduce(optimizer)

  @tf.function
  def step():
    def replica_fn():
      grads = allreduce.all_reduce_gradients([tf.ones([3])])
      optimizer.apply_gradients(zip(grads, [var]))
    mirrored.run(replica_fn)

  step()
  pairs = [(var, var_ref)] + list(zip(optimizer.variables, ref.variables))
  _assert_replicas_equal(mirrored, pairs)


def test_a_keras_without_the_hook_is_refused():
  class NoHook:
    pass
  with pytest.raises(RuntimeError, match="dist_keras needs updating"):
    keras_internals.disable_optimizer_allreduce(NoHook())


def _clipped_sgd():
  return keras.optimizers.SGD(1.0, clipvalue=2.5)


def _clipped_sgd_loss_scaled():
  # Scale 1: the replicas' gradients are already "scaled", by 1.
  return keras.optimizers.LossScaleOptimizer(_clipped_sgd(), initial_scale=1.0)


@pytest.mark.parametrize("make_optimizer", [_clipped_sgd,
                                            _clipped_sgd_loss_scaled])
def test_reduce_in_apply_clips_the_summed_gradient_once(make_optimizer,
                                                        mirrored):
  """A model's own train_step hands `apply_gradients` its replica's gradient
  (model_step.py; compiled.prepare_optimizers wraps `apply` with a SUM): the
  wrapped `apply` must SUM it over the replicas (1 + 2
  = 3), then clip (2.5) and apply it once, as one device applying 3. Keras'
  own reduction clips each replica's first (1 + 2 = 3 applied); reduced
  twice, 2.5 + 2.5 = 5 would be. A LossScaleOptimizer's `apply` is wrapped,
  its inner one's reduction must be off too."""
  var_ref, ref = _one_device(make_optimizer, 3.0)
  np.testing.assert_allclose(var_ref.numpy(), [-2.5] * 3)  # Clipped.
  var, optimizer = _built(mirrored.scope(), make_optimizer)
  keras_internals.reduce_in_apply(optimizer, allreduce.all_reduce_gradients)

  @tf.function
  def step():
    mirrored.run(
        lambda: optimizer.apply_gradients([(_replica_grad(), var)]))

  step()
  _assert_replicas_equal(mirrored, [(var, var_ref)] + list(
      zip(optimizer.variables, ref.variables)))


def _first_element(values):
  """An Embedding-like gradient of the 3-float variable: `values`, every
  one a slice of element 0."""
  return tf.IndexedSlices(values, tf.zeros(tf.shape(values), tf.int32),
                          tf.constant([3]))


def test_reduce_in_apply_hands_adam_every_replicas_slice(mirrored):
  """A model's own train_step with an Embedding: replica r's slice of
  element 0 (r + 1) must reach Adam as both slices, as one device's would
  (second moment from 1 + 4), not summed (3 * 3: the weight moves 1 * lr,
  not 3 / sqrt(5) * lr)."""
  def make():
    return keras.optimizers.Adam(0.1)

  var_ref, ref = _built(tf.name_scope("one_device"), make)
  ref.apply_gradients([(_first_element(tf.constant([1.0, 2.0])), var_ref)])
  var, optimizer = _built(mirrored.scope(), make)
  keras_internals.reduce_in_apply(optimizer, allreduce.all_reduce_gradients)

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      own = tf.reshape(tf.cast(r, tf.float32) + 1.0, [1])
      optimizer.apply_gradients([(_first_element(own), var)])
    mirrored.run(replica_fn)

  step()
  _assert_replicas_equal(mirrored, [(var, var_ref)] + list(
      zip(optimizer.variables, ref.variables)))


def _sgd_ema_overwrite():
  # The overwrite is the tf.cond whose branch merge_calls; EMA alone has none.
  return keras.optimizers.SGD(0.1, use_ema=True, ema_overwrite_frequency=1)


def _sgd_accumulating():
  return keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)


def _sgd_accumulating_loss_scaled():
  return keras.optimizers.LossScaleOptimizer(_sgd_accumulating(),
                                             initial_scale=1.0)


@pytest.mark.parametrize("make_optimizer", [
    _sgd_ema_overwrite, _sgd_accumulating, _sgd_accumulating_loss_scaled])
def test_update_without_merge_call_updates_as_one_device(make_optimizer,
                                                         mirrored):
  """EMA's overwrite and gradient accumulation update inside a tf.cond whose
  branches merge_call, which TensorFlow refuses in a replica context of 2
  ("`merge_call` called while defining a new graph"). Patched, the update
  runs (`_backend_apply_gradients` wrapped, TensorFlow's `_use_merge_call`
  switched off meanwhile) and 2 steps of all-reduced gradients leave every
  replica's weights and slots as one device's; then the strategy's own
  `_use_merge_call` is back (the instance's override deleted), or every
  later step on this strategy would skip merge_call too."""
  var_ref, ref = _one_device(make_optimizer, 3.0, steps=2)
  var, optimizer = _built(mirrored.scope(), make_optimizer)
  keras_internals.disable_optimizer_allreduce(optimizer)
  keras_internals.update_without_merge_call(optimizer)

  @tf.function
  def step():
    def replica_fn():
      grads = allreduce.all_reduce_gradients([_replica_grad()])
      optimizer.apply_gradients(zip(grads, [var]))
    mirrored.run(replica_fn)

  step()
  step()
  _assert_replicas_equal(mirrored, [(var, var_ref)] + list(
      zip(optimizer.variables, ref.variables)))
  extended = mirrored.extended
  assert "_use_merge_call" not in vars(extended)
  # The class's own: on CPUs, merge_call.
  assert extended._use_merge_call()  # pylint: disable=protected-access


def _two_output_model(losses):
  inputs = keras.Input((2,))
  outputs = [keras.layers.Dense(1, name="a")(inputs),
             keras.layers.Dense(1, name="b")(inputs)]
  model = keras.Model(inputs, outputs)
  model.compile(optimizer="sgd", loss=losses)
  return model


def test_output_loss_trackers_are_the_per_output_means():
  """Two losses: one Mean per output (`_compile_loss.metrics`), named
  NAME_loss, whose `total` / `count` is that output's loss; a batch of 4
  with a static shape counts 4 (the weight the eval pass re-weighs)."""
  model = _two_output_model(["mse", "mae"])
  x = np.ones((4, 2), np.float32)
  y_a, y_b = np.full((4, 1), 1.0, np.float32), np.full((4, 1), -2.0, np.float32)
  pred_a, pred_b = model.predict_on_batch(x)
  model.test_on_batch(x, [y_a, y_b])  # Builds the compiled loss.
  trackers = keras_internals.output_loss_trackers(model)
  assert [t.name for t in trackers] == ["a_loss", "b_loss"]
  expected = [np.mean((pred_a - y_a) ** 2), np.mean(np.abs(pred_b - y_b))]
  for tracker, want in zip(trackers, expected):
    assert float(tracker.count.value) == 4.0
    assert float(tracker.total.value) / 4.0 == pytest.approx(want, rel=1e-5)
    assert float(tracker.result()) == pytest.approx(want, rel=1e-5)


def test_one_loss_or_none_has_no_output_loss_trackers():
  one = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  one.compile(optimizer="sgd", loss="mse")
  one.test_on_batch(np.ones((4, 2)), np.ones((4, 1)))
  assert keras_internals.output_loss_trackers(one) == []
  gan = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
  gan.compile(optimizer="sgd")  # No compiled loss at all.
  assert keras_internals.output_loss_trackers(gan) == []


def test_compiled_losses_are_each_output_loss_with_its_inputs():
  """`_compile_loss._flat_losses`: each output's loss (a keras Loss) with
  that output's labels and predictions, in call order; a wrapped one is
  what the compiled loss computes, and the compile config keeps the loss."""
  model = _two_output_model(["mse", "mae"])
  x = np.ones((4, 2), np.float32)
  y = [np.full((4, 1), 1.0, np.float32), np.full((4, 1), -2.0, np.float32)]
  y_pred = [tf.constant(p) for p in model.predict_on_batch(x)]
  found = keras_internals.compiled_losses(model, y, y_pred, None)
  assert [(i, type(loss).__name__) for i, loss, _, _ in found] == [
      (0, "LossFunctionWrapper"), (1, "LossFunctionWrapper")]
  for (_, _, y_t, y_p), want_t, want_p in zip(found, y, y_pred):
    np.testing.assert_array_equal(y_t, want_t)
    np.testing.assert_array_equal(y_p, want_p)
  before = float(model.compute_loss(x, y, y_pred))
  keras_internals.wrap_compiled_loss(
      model, 1, lambda loss: lambda *args: 10.0 * loss(*args))
  mae = float(np.mean(np.abs(y_pred[1].numpy() - y[1])))
  assert float(model.compute_loss(x, y, y_pred)) == pytest.approx(
      before + 9.0 * mae, rel=1e-5)
  assert model.get_compile_config()["loss"] == ["mse", "mae"]


def test_a_tracker_without_its_total_is_refused():
  tracker = types.SimpleNamespace(count=1.0)  # A Mean whose state moved.
  model = types.SimpleNamespace(
      _compile_loss=types.SimpleNamespace(metrics=[tracker]))
  with pytest.raises(RuntimeError, match=r"no total \(.*dist_keras needs "
                     r"updating"):
    keras_internals.output_loss_trackers(model)


def test_applied_batches_is_what_the_schedule_reads():
  """`_iterations` counts applied batches; with gradient accumulation the
  public `iterations` counts updates (batches // 2), and the schedule is
  evaluated at the batches, so lr.last_applied reads `_iterations`."""
  schedule = keras.optimizers.schedules.PolynomialDecay(0.1, decay_steps=10,
                                                        end_learning_rate=0.0)
  plain = keras.optimizers.SGD(schedule)
  accumulating = keras.optimizers.SGD(schedule, gradient_accumulation_steps=2)
  for optimizer in (plain, accumulating):
    var = keras.Variable(np.zeros(3, np.float32))
    for _ in range(4):
      optimizer.apply_gradients([(tf.ones([3]), var)])
    assert int(keras_internals.applied_batches(optimizer)) == 4
    assert float(optimizer.learning_rate) == pytest.approx(
        float(schedule(4)))  # 0.06; at the updates (2) it would be 0.08.
  assert int(plain.iterations) == 4
  assert int(accumulating.iterations) == 2
  # Its 2 updates (batches 2 and 4) ran at batches 1 and 3: 0.09, 0.07.
  np.testing.assert_allclose(var.numpy(), [-0.09 - 0.07] * 3)


def test_applied_batches_of_a_loss_scale_optimizer_are_its_inner_ones():
  inner = keras.optimizers.SGD(0.1)
  optimizer = keras.optimizers.LossScaleOptimizer(inner)
  var = keras.Variable(np.zeros(3, np.float32))
  for _ in range(3):
    optimizer.apply_gradients([(tf.ones([3]), var)])
  assert int(keras_internals.applied_batches(optimizer)) == 3
  # The wrapper's own counter never moves: reading it would say 0.
  assert int(optimizer._iterations) == 0  # pylint: disable=protected-access


@pytest.mark.parametrize("wrap", [lambda o: o,
                                  keras.optimizers.LossScaleOptimizer])
def test_built_on_are_the_variables_in_the_order_of_the_averages(wrap):
  """What Keras' apply updates (any other is an "Unknown variable") and
  what its EMA averages are zipped with; None for an unbuilt optimizer."""
  first, second = (keras.Variable(np.full(3, v, np.float32)) for v in (1, 2))
  optimizer = wrap(keras.optimizers.SGD(0.1, use_ema=True))
  assert keras_internals.built_on(optimizer) is None
  optimizer.build([first, second])
  built = keras_internals.built_on(optimizer)
  assert [v is w for v, w in zip(built, [first, second])] == [True, True]
  with pytest.raises(ValueError, match="Unknown variable"):
    optimizer.apply_gradients([(tf.ones([3]), keras.Variable(np.zeros(3)))])
  # The first update sets each average to its variable's value.
  optimizer.apply_gradients([(tf.zeros([3]), v) for v in (first, second)])
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  averages = inner._model_variables_moving_average  # pylint: disable=protected-access
  assert [float(a.numpy()[0]) for a in averages] == [1.0, 2.0]


def test_rate_schedule_finds_a_schedule_and_only_a_schedule():
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5)
  wrap = keras.optimizers.LossScaleOptimizer
  assert keras_internals.rate_schedule(keras.optimizers.SGD(schedule)) is (
      schedule)
  assert keras_internals.rate_schedule(
      wrap(keras.optimizers.SGD(schedule))) is schedule
  assert keras_internals.rate_schedule(keras.optimizers.SGD(0.1)) is None
  assert keras_internals.rate_schedule(
      wrap(keras.optimizers.SGD(0.1))) is None
  # A plain callable is no schedule: lr.py reads it as a rate, not a step's.
  assert keras_internals.rate_schedule(
      keras.optimizers.SGD(lambda: 0.1)) is None


def test_unscaled_loss_undoes_keras_distribution_scaling(mirrored):
  """Keras' losses divide a replica's loss by the replica count (so SUMmed
  gradients are one device's); unscaled_loss gives back the replica's own
  loss, as Keras' train_step feeds its loss tracker. One replica: as is."""
  y_true = tf.zeros([4, 1])
  y_pred = tf.fill([4, 1], 3.0)  # MSE 9.

  def replica_fn():
    scaled = keras.losses.MeanSquaredError()(y_true, y_pred)
    return scaled, metrics.unscaled_loss(scaled)

  scaled, unscaled = mirrored.run(tf.function(replica_fn))
  for value in mirrored.experimental_local_results(scaled):
    assert float(value) == pytest.approx(4.5)
  for value in mirrored.experimental_local_results(unscaled):
    assert float(value) == pytest.approx(9.0)
  loss = keras.losses.MeanSquaredError()(y_true, y_pred)
  assert float(loss) == pytest.approx(9.0)
  assert metrics.unscaled_loss(loss) is loss


def test_require_names_the_type_the_attribute_and_this_module():
  require = keras_internals._require  # pylint: disable=protected-access
  with pytest.raises(RuntimeError) as raised:
    require(keras.optimizers.SGD(0.1), "_moved", "its thing")
  message = str(raised.value)
  assert "\n" not in message
  for part in ("SGD has no _moved (its thing)", "dist_keras needs updating",
               MODULE):
    assert part in message


def test_clipping_done_applies_unclipped_then_clips_again():
  """`_clip_gradients` is what Keras' update clips with: while
  clipping_done runs, a gradient of norm 5 under global_clipnorm 1 is
  applied whole (dist_keras clipped it: sparse_grads.py), after it clipped
  to norm 1 again (the instance's override deleted)."""
  var, optimizer = _built(tf.name_scope("clip"), lambda: keras.optimizers.SGD(
      1.0, global_clipnorm=1.0))
  grad = tf.constant([3.0, 4.0, 0.0])
  with keras_internals.clipping_done(optimizer):
    optimizer.apply_gradients([(grad, var)])
  np.testing.assert_allclose(var.numpy(), [-3.0, -4.0, 0.0])
  assert keras_internals.CLIP_HOOK not in vars(optimizer)
  optimizer.apply_gradients([(grad, var)])
  np.testing.assert_allclose(var.numpy(), [-3.6, -4.8, 0.0], rtol=1e-6)


def test_clipping_done_is_undone_once_every_replica_left(mirrored):
  """Under Mirrored every replica's thread enters clipping_done, their
  turns overlapping (each waits in the update's merge_call while the next
  enters): both apply unclipped, and after them the optimizer clips again
  (undone by the first to leave, the second's override had stayed)."""
  var, optimizer = _built(mirrored.scope(), lambda: keras.optimizers.SGD(
      1.0, global_clipnorm=1.0))
  keras_internals.disable_optimizer_allreduce(optimizer)

  @tf.function
  def step():
    def replica_fn():
      with keras_internals.clipping_done(optimizer):
        optimizer.apply_gradients([(tf.constant([3.0, 4.0, 0.0]), var)])
    mirrored.run(replica_fn)

  step()
  assert keras_internals.CLIP_HOOK not in vars(optimizer)
  for value in mirrored.experimental_local_results(var.value):
    np.testing.assert_allclose(value, [-3.0, -4.0, 0.0])


def test_clips_as_keras_tells_an_optimizer_with_its_own_clip():
  class OwnClip(keras.optimizers.SGD):
    def _clip_gradients(self, grads):
      return grads

  assert keras_internals.clips_as_keras(keras.optimizers.Adam(0.1))
  assert not keras_internals.clips_as_keras(OwnClip(0.1, global_clipnorm=1.0))


def test_the_tables_clip_is_keras_clip_of_the_slices():
  """sparse_grads' clip of a summed table (and a dense gradient), with the
  slices' squares, is what Keras' `_clip_gradients` makes of the slices:
  its global norm squares each slice (3, 4 of row 0: norm 5 with the dense
  12, 13 in all), not the summed row (7: 13.9); and a norm that is inf
  makes every gradient NaN, as Keras' finite-scale trick does."""
  optimizer = keras.optimizers.Adam(0.1, global_clipnorm=2.0)
  slices = tf.IndexedSlices(tf.constant([[3.0], [4.0]]), tf.constant([0, 0]),
                            tf.constant([2, 1]))
  dense = tf.constant([12.0])
  tables = sparse_grads.Tables((True, False), clip_norm=2.0)

  def both(dense):
    keras_clip = optimizer._clip_gradients([slices, dense])  # pylint: disable=protected-access
    ours = tables.clip_by_global_norm(
        allreduce.dense_gradients([slices, dense]), tf.constant(25.0))
    return [tf.convert_to_tensor(g) for g in keras_clip], ours

  keras_clip, ours = both(dense)
  np.testing.assert_allclose(keras_clip[0], [[7.0 * 2 / 13], [0.0]],
                             rtol=1e-6)
  for want, got in zip(keras_clip, ours):
    np.testing.assert_allclose(got, want, rtol=1e-6)
  for clipped in both(dense * np.inf):
    assert np.isnan(clipped[0]).all() and np.isnan(clipped[1]).all()


@pytest.mark.parametrize("use, name", [
    (keras_internals.clips_as_keras, "_clip_gradients"),
    (lambda o: keras_internals.clipping_done(o).__enter__(),
     "_clip_gradients"),
    (keras_internals.applied_batches, "_iterations"),
    (keras_internals.update_without_merge_call, "_backend_apply_gradients"),
    (keras_internals.rate_schedule, "_learning_rate"),
    (keras_internals.built_on, "_trainable_variables"),
])
def test_an_optimizer_without_a_private_name_is_refused(use, name):
  """What dist_keras reads of an optimizer, missing: an error naming it."""
  bare = types.SimpleNamespace(gradient_accumulation_steps=2, use_ema=False,
                               built=True)
  with pytest.raises(RuntimeError, match=f"SimpleNamespace has no {name} "):
    use(bare)


def test_flatten_layers_reaches_the_layers_of_nested_models():
  """`Layer._flatten_layers`, which installation.layers_in walks for
  model_checks.py (the list its checks read), contract/, own_losses.py
  and measure/flops.py to find a model's BatchNormalization layers, stateful
  RNNs, own losses and state, unjittable layers and FLOPs: every layer
  however deeply nested, each once, the model itself only when asked for.
  A release that stops at the first level would hide a stateful LSTM inside
  a sub-model from the batch check and its FLOPs from MFU; one without it
  is refused in one line."""
  inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="deep")],
                           name="inner")
  shared = keras.layers.Dense(2, name="shared")
  x = keras.Input((3,))
  outer = keras.Model(x, shared(inner(x)) + shared(inner(x)), name="outer")
  walked = installation.layers_in(outer, include_self=False)
  names = [layer.name for layer in walked
           if not isinstance(layer, keras.layers.InputLayer)]
  assert names == ["inner", "deep", "shared"], names
  assert installation.layers_in(outer, include_self=True)[0] is outer
  with pytest.raises(RuntimeError, match="SimpleNamespace has no "
                     "_flatten_layers .*dist_keras needs updating"):
    installation.layers_in(types.SimpleNamespace(), include_self=True)


def test_keras_name_scopes_kept_puts_back_the_scope_a_refused_name_left():
  """Keras pushes a layer's name scope before TensorFlow refuses its name
  at a graph's root, and never pops it: the guard puts the stack back
  (installation.keras_name_scopes_kept, read from keras.src's state)."""
  from dist_keras import installation  # pylint: disable=g-import-not-at-top
  layer = keras.layers.Dense(1, name="_private")
  layer.build((None, 2))
  trace = tf.function(layer).get_concrete_function
  with pytest.raises(ValueError, match="not a valid root scope name"):
    with installation.keras_name_scopes_kept():
      trace(tf.TensorSpec((None, 2)))
  after = keras.layers.Dense(1, name="after")
  after.build((None, 2))
  assert after.kernel.path == "after/kernel"


def test_made_per_run_omits_tensorflows_retracing_warning():
  """TensorFlow warns when 5 of a code object's last calls traced, over
  every tf.function made of it; one made_per_run marks is not counted
  (the control, unmarked, is)."""

  def make():
    return tf.function(lambda x: x + 1)

  with helpers.logged() as warned:
    for _ in range(6):
      keras_internals.made_per_run(make())(tf.constant(1.0))
    quiet = list(warned)
    for _ in range(6):
      make()(tf.constant(1.0))
  assert not quiet
  assert any("triggered tf.function retracing" in w for w in warned)
