"""Every private part of Keras (and TensorFlow) the training uses, in one
place.

dist_keras trains compiled Keras models with its own loop, which needs a few
things Keras has no public API for. Training reaches each only here
(measure/flops.py reads Keras' functional graphs, `_nodes_by_depth` and
the layers' `_inbound_nodes`, to count FLOPs: tests/measure checks them), and
tests/training/test_keras_internals.py checks each directly, in seconds,
so a Keras release that moves or changes one fails there, naming it
(rather than training silently wrong). At run time `_require` refuses a
Keras without a name it needs; `_compile_loss` alone is read with a default
(a model compiled without a loss has none), so a move of it only the tests
catch.

- `_all_reduce_sum_gradients`: Keras 3 optimizers SUM-all-reduce gradients
  inside `apply_gradients`, after clipping them, i.e. clipping each
  replica's own gradient. dist_keras reduces first, itself, so that clipping
  (and gradient accumulation, and the loss-scale check) sees the global
  gradient and N replicas equal one device; the optimizer's own reduction
  is turned off.
- `_compile_loss._flat_losses`: the compiled loss's own losses, one per
  output, each a namedtuple whose `loss` the compiled loss calls; a loss
  that returns one number per batch is wrapped there (batch_losses.py).
- `_compile_loss.metrics`: the per-output loss trackers, which Keras weighs
  by a batch's STATIC size (so a partial eval batch of unknown size counted
  like a full one); the eval pass re-weighs them by the batch's examples.
- `_iterations`: the optimizer's count of applied batches (with gradient
  accumulation `iterations` counts updates), which its schedule reads.
- `_learning_rate`: whether the rate is a schedule.
- `_trainable_variables`: what an optimizer was built on, its slots' order.
- `_backend_apply_gradients` and TensorFlow's `_use_merge_call`: gradient
  accumulation and EMA's overwrite of the weights (ema_overwrite_frequency)
  put the update inside a tf.cond whose branches merge_call (Keras' TF
  optimizer), which TensorFlow refuses in the replica context of more than
  one replica, so Keras' own fit cannot train them under MirroredStrategy
  (update_without_merge_call).
- `_clip_gradients`: the optimizer's clip, run on the gradients it is
  handed. Where dist_keras clips an Embedding's reduced table itself, with
  the norm Keras takes from its slices (sparse_grads.py), the optimizer's
  own clip is the identity meanwhile (clipping_done); an optimizer class
  that clips its own way keeps Keras' (clips_as_keras).
- TensorFlow's `_omit_frequent_tracing_warning` on a tf.function
  (made_per_run), and a checkpoint's `_deferred_dependencies`, whose
  restore a refusal abandons (restore_abandoned).

`keras.random.SeedGenerator.next` (public, but replaced while a replica's
step traces, so each replica draws its own numbers) is replica_seeds.py's.
Keras' name-scope stack (keras.src's global state), which a trace that
TensorFlow refused a layer's name in leaves pushed, is put back by
installation.keras_name_scopes_kept, and `Layer._flatten_layers`, every
layer of a model at any depth, is walked through installation.layers_in
(contract/ and measure/ use both too).
"""
import contextlib
import threading

import keras
import tensorflow as tf

from dist_keras import installation

_HERE = "dist_keras/training/keras_internals.py"  # What a change updates.
ALLREDUCE_HOOK = "_all_reduce_sum_gradients"
CLIP_HOOK = "_clip_gradients"


def _require(obj, name: str, what: str):
  return installation.require(obj, name, what, _HERE)


def inner(optimizer):
  """The optimizer that updates the weights: a LossScaleOptimizer's inner
  one (train.precision=float16), else `optimizer` itself."""
  return getattr(optimizer, "inner_optimizer", optimizer)


def disable_optimizer_allreduce(optimizer) -> None:
  """Makes `optimizer` (and a LossScaleOptimizer's inner one) apply the
  gradients as given: the caller has reduced them.

  Raises:
    RuntimeError: this Keras has no such hook; gradients would be reduced
      twice (scaled by the replica count), so refuse to train.
  """
  if not callable(_require(optimizer, ALLREDUCE_HOOK, "its all-reduce")):
    raise RuntimeError(f"{type(optimizer).__name__}.{ALLREDUCE_HOOK} is not "
                       "callable: dist_keras needs updating.")
  setattr(optimizer, ALLREDUCE_HOOK, lambda grads_and_vars: list(
      grads_and_vars))
  wrapped = getattr(optimizer, "inner_optimizer", None)
  if wrapped is not None:
    disable_optimizer_allreduce(wrapped)


def reduce_in_apply(optimizer, all_reduce) -> None:
  """For a model's own train_step: `optimizer.apply` (which
  `apply_gradients` calls) all-reduces the gradients with `all_reduce`
  first, then applies them as one device would; the optimizer's own
  reduction (after clipping) is off."""
  disable_optimizer_allreduce(optimizer)
  apply = optimizer.apply

  def apply_reduced(grads, trainable_variables=None):
    return apply(all_reduce(list(grads)), trainable_variables)

  optimizer.apply = apply_reduced


def clips_as_keras(optimizer) -> bool:
  """Whether `optimizer`'s class clips with Keras' own `_clip_gradients`
  (what sparse_grads' clip reproduces), not an override of its own."""
  _require(optimizer, CLIP_HOOK, "its clip")
  return getattr(type(optimizer), CLIP_HOOK, None) is getattr(
      keras.optimizers.Optimizer, CLIP_HOOK)


@contextlib.contextmanager
def clipping_done(optimizer):
  """While it runs, `optimizer` applies gradients as given, unclipped: the
  caller clipped them as it would have (sparse_grads.py).

  Every replica's thread of a MirroredStrategy step enters it, their turns
  overlapping (each pauses in the update's merge_call while the next one
  enters): the optimizer's own clip is back once the last has left, not
  the first.

  Raises:
    RuntimeError: this Keras has no such clip to turn off; the gradients
      would be clipped twice (again by the norm of the summed table).
  """
  _require(optimizer, CLIP_HOOK, "its clip")
  with _UNCLIPPED_LOCK:
    inside, own = _UNCLIPPED.get(id(optimizer), (0, vars(optimizer).get(
        CLIP_HOOK)))
    _UNCLIPPED[id(optimizer)] = (inside + 1, own)
    setattr(optimizer, CLIP_HOOK, lambda grads: grads)
  try:
    yield
  finally:
    with _UNCLIPPED_LOCK:
      inside, own = _UNCLIPPED.pop(id(optimizer))
      if inside > 1:
        _UNCLIPPED[id(optimizer)] = (inside - 1, own)
      elif own is None:
        delattr(optimizer, CLIP_HOOK)  # Back to the class's own.
      else:
        setattr(optimizer, CLIP_HOOK, own)


# id(optimizer) -> (threads inside clipping_done, the instance's own clip).
_UNCLIPPED = {}
_UNCLIPPED_LOCK = threading.Lock()


def made_per_run(function):
  """`function`, a tf.function each run makes anew, without TensorFlow's
  "triggered tf.function retracing" warning: TensorFlow counts traces by
  the Python code, not by the function, so from about a process's fifth
  fit (a sweep, a notebook) it warned as if one function traced again and
  again."""
  _require(function, "_omit_frequent_tracing_warning",
           "TensorFlow's retracing warning switch")
  function._omit_frequent_tracing_warning = True  # pylint: disable=protected-access
  return function


def restore_abandoned(checkpoint) -> None:
  """Marks a restore into `checkpoint` that failed (another model's
  checkpoint: refused) as partial, as its status' expect_partial() would
  (one that raised has none): the values it left waiting for objects not
  made yet (the checkpoint's save_counter) printed TensorFlow's "...
  being deleted with unrestored values" lines as they were collected,
  after the run's one-line refusal (a notebook's next cell)."""
  waiting = _require(checkpoint, "_deferred_dependencies",
                     "TensorFlow's deferred restores")
  for positions in waiting.values():
    for position in positions:
      _require(position, "checkpoint", "its restore").expect_partial = True


def hooks_put_back(optimizers):
  """A function that gives each of `optimizers` (and a LossScaleOptimizer's
  inner one) back the attributes the hooks here replace, as they are now
  (the class's own where the instance has none): the run's are put back
  as it ends, so that Keras' fit of the returned model all-reduces as its
  own would."""
  saved = [(opt, name, vars(opt).get(name)) for optimizer in optimizers
           for opt in (optimizer, getattr(optimizer, "inner_optimizer", None))
           if opt is not None for name in _HOOKED]

  def put_back():
    for opt, name, own in saved:
      if own is not None:
        setattr(opt, name, own)
      elif name in vars(opt):
        delattr(opt, name)

  return put_back


# What disable_optimizer_allreduce, reduce_in_apply and
# update_without_merge_call replace on an optimizer.
_HOOKED = (ALLREDUCE_HOOK, "apply", "_backend_apply_gradients")


def update_without_merge_call(optimizer) -> None:
  """Lets an optimizer with gradient accumulation or EMA update under a
  strategy of several replicas (see the module's docstring).

  Keras puts those updates (EMA's: its overwrite of the weights) inside a
  tf.cond whose branches merge_call, which TensorFlow refuses in a replica
  context. While the update runs, the strategy is asked to update each
  replica's own copy of every variable in the replica context instead
  (`_use_merge_call` False: TensorFlow's own path for XLA-compiled steps on
  GPUs). The gradients are all-reduced before, so every replica applies
  the same update.
  """
  for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
    if opt is None or not (opt.gradient_accumulation_steps or opt.use_ema):
      continue
    update = _require(opt, "_backend_apply_gradients", "its update")

    def without_merge_call(grads, variables, update=update):
      extended = tf.distribute.get_strategy().extended
      _require(extended, "_use_merge_call", "TensorFlow's merge_call switch")
      extended._use_merge_call = lambda: False  # pylint: disable=protected-access
      try:
        return update(grads, variables)
      finally:
        del extended._use_merge_call  # Back to the class's own.

    opt._backend_apply_gradients = without_merge_call  # pylint: disable=protected-access


def output_loss_trackers(model) -> list:
  """The per-output loss trackers (keras.metrics.Mean: `NAME_loss`) of a
  model compiled with several losses; [] for one loss."""
  compile_loss = getattr(model, "_compile_loss", None)
  trackers = list(getattr(compile_loss, "metrics", None) or [])
  for tracker in trackers:
    _require(tracker, "total", "a Mean's state")
    _require(tracker, "count", "a Mean's state")
  return trackers


def compiled_losses(model, y, y_pred, sample_weight) -> list:
  """[(index, loss, y_true, y_pred)]: each loss of the compiled loss (a
  keras.losses.Loss) with what the compiled loss hands it for the batch
  (y, y_pred, sample_weight), in the order it calls them. The calls update
  the per-output loss trackers: reset the metrics after."""
  compile_loss = _require(model, "_compile_loss", "its compiled loss")
  compile_loss(y, y_pred, sample_weight)  # Builds its list of losses.
  flat = _require(compile_loss, "_flat_losses", "its losses, one per output")
  original, seen = list(flat), []
  for i, entry in enumerate(original):
    def record(y_t, y_p, weights=None, i=i, loss=entry.loss):
      seen.append((i, loss, y_t, y_p))
      return loss(y_t, y_p, weights)
    flat[i] = entry._replace(loss=record)
  try:
    compile_loss(y, y_pred, sample_weight)
  finally:
    flat[:] = original
  return seen


def wrap_compiled_loss(model, index: int, wrap) -> None:
  """Has the compiled loss call `wrap(loss)` for its `index`-th loss (what
  it computes only: model.keras and get_compile_config keep the loss as
  compiled)."""
  flat = model._compile_loss._flat_losses  # pylint: disable=protected-access
  flat[index] = flat[index]._replace(loss=wrap(flat[index].loss))


def applied_batches(optimizer):
  """The batches the updating optimizer has applied (a LossScaleOptimizer's
  inner one): what its learning-rate schedule is evaluated at."""
  optimizer = inner(optimizer)
  return _require(optimizer, "_iterations", "its step counter")


def rate_schedule(optimizer):
  """The updating optimizer's LearningRateSchedule, or None."""
  optimizer = inner(optimizer)
  # Required: read with a default, a moved name would make a schedule look
  # like a constant rate, which lr.apply would then overwrite.
  rate = _require(optimizer, "_learning_rate", "its rate or schedule")
  if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
    return rate
  return None


def built_on(optimizer) -> list | None:
  """The variables `optimizer` (a LossScaleOptimizer's inner one) was
  built on, in the order of its slots and averages; None before build."""
  optimizer = inner(optimizer)
  if not optimizer.built:
    return None
  return list(_require(optimizer, "_trainable_variables", "its variables"))
