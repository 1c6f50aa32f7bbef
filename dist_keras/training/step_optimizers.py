"""The optimizers a model's own train_step applies, built before training
on the variables that step hands them.

keras.io's GANs create their d_optimizer and g_optimizer and never build
them: Keras' fit on one device builds each at its first `apply`, on the
variables handed to it. A replica's step cannot create variables (Keras'
own fit under MirroredStrategy fails there: "You must feed a value for
placeholder tensor"), so they are made before training, in scope: the
model's train_step is traced once in each replica on a batch like the
train split's (the loop's own step calls it so; nothing runs; the trace
random_ops reads too: StepTrace), while every
optimizer of the model records the variables each `apply` (which
`apply_gradients` calls) or `build` is handed, and does nothing else. Each
unbuilt one is then built on those variables, as its first apply would.
One the traced step never applies stays unbuilt, as under fit, which
builds an optimizer at its first apply only: the loop's step is traced
the same way (no AutoGraph, on the same batches), so it never applies it
either. One whose variables the trace cannot say (a train_step that fails
to trace, one handed different variables in different calls) stays
unbuilt with the reason: compiled.prepare_optimizers refuses it.
"""
import contextlib

import keras
import tensorflow as tf

from dist_keras import errors, installation


class StepTrace:
  """Where a run's step is traced: `model`, `strategy`, the model's
  `optimizers` ({attribute: optimizer}: compiled.optimizers_of) and
  `batch_spec` (a train batch's, per replica); and the model's own
  train_step traced there once, its optimizers recording (traced_step),
  for the checks that read it: random_ops its graph (first, while it
  records Keras' global seed draws), build_applied what each optimizer is
  handed. One trace where each traced its own: ~0.25 s of a small conv
  GAN's 4 s run under Mirrored, more for a bigger step."""

  def __init__(self, model, strategy, optimizers: dict, batch_spec):
    self.model, self.strategy = model, strategy
    self.optimizers, self.batch_spec = optimizers, batch_spec
    self._own = None

  def own_step(self) -> tuple:
    """(the graph, {id(optimizer): [variable lists handed to it]}) of the
    model's train_step, traced at the first call; raises what stopped
    the trace, at every call."""
    if self._own is None:
      handed = {}
      try:
        self._own = (traced_step(self.model.train_step, self.strategy,
                                 self.optimizers.values(), self.batch_spec,
                                 handed), handed)
      except Exception as e:  # pylint: disable=broad-except
        self._own = e  # (Each caller says it its own way.)
    if isinstance(self._own, Exception):
      raise self._own
    return self._own


def build_applied(step: StepTrace) -> dict:
  """Builds, in scope, each unbuilt optimizer of `step.optimizers` on the
  variables the model's train_step hands it; one it never applies stays
  unbuilt.

  Returns:
    {attribute: why it is still unbuilt} for those it could not build.
  """
  unbuilt = {name: o for name, o in step.optimizers.items() if not o.built}
  if not unbuilt:
    return {}
  handed, failure = _handed(step)
  why = {}
  with step.strategy.scope():
    for name, optimizer in unbuilt.items():
      lists = handed.get(id(optimizer), [])
      why[name] = failure or _unusable(lists)
      if not why[name] and lists:
        # As Keras' apply builds it: in its name scope, flagged built.
        with keras.name_scope(optimizer.name, caller=optimizer):
          optimizer.build(lists[0])
        optimizer.built = True
  return {name: reason for name, reason in why.items() if reason}


def _unusable(lists) -> str | None:
  """Why the variable lists one optimizer was handed do not say exactly
  what to build it on; None where they do, or where there are none (it is
  never applied, and never built: fit leaves it unbuilt too)."""
  for other in lists[1:]:
    if not _same(other, lists[0]):
      return ("the model's train_step hands it different variables in "
              f"different calls ({_named(lists[0])}, then {_named(other)})")
  return None


def _same(a, b) -> bool:
  return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _named(variables) -> str:
  first = variables[0].path if variables else "none"
  return f"{len(variables)} variable(s) from {first!r}"


def _handed(step: StepTrace):
  """({id(optimizer): [variable lists handed to it]}, None) from the
  model's train_step traced on `step.batch_spec`, or ({}, why) where it
  could not be traced."""
  try:
    return step.own_step()[1], None
  except Exception as e:  # pylint: disable=broad-except
    # Whatever stops the trace stops this build only: the refusal says it.
    return {}, ("the model's train_step could not be traced on a batch like"
                f" the train split's ({errors.first_line(e)})")


def traced_step(replica_fn, strategy, optimizers, batch_spec,
                handed: dict | None = None):
  """The graph of `replica_fn` (a train_step) traced in each replica on
  `batch_spec`, as the loop's step calls it (no AutoGraph), while
  `optimizers` only record in `handed` the variables they are handed:
  nothing moves, and the trace is not run."""

  def step(batch):
    strategy.run(replica_fn, args=(batch,))
    return tf.constant(0)

  handed = {} if handed is None else handed
  with (strategy.scope(), installation.keras_name_scopes_kept(),
        contextlib.ExitStack() as stack):
    for optimizer in optimizers:
      stack.enter_context(recording(optimizer, handed))
    function = tf.function(step, autograph=False)
    return function.get_concrete_function(batch_spec).graph


@contextlib.contextmanager
def recording(optimizer, handed: dict):
  """While it lasts, `optimizer.apply` and `optimizer.build` (instance
  attributes over the class's) record the variables they are handed in
  `handed[id(optimizer)]` and update nothing."""
  own = {name: vars(optimizer)[name] for name in ("apply", "build")
         if name in vars(optimizer)}  # (An apply that all-reduces first.)
  lists = handed.setdefault(id(optimizer), [])

  def apply(grads, trainable_variables=None):
    # Keras' apply builds only on a non-empty list of gradients.
    if len(grads) and trainable_variables is not None:
      lists.append(list(trainable_variables))

  def build(variables):
    lists.append(list(variables))

  optimizer.apply, optimizer.build = apply, build
  try:
    yield
  finally:
    for name in ("apply", "build"):
      if name in own:
        setattr(optimizer, name, own[name])
      else:
        delattr(optimizer, name)
