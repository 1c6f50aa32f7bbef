"""The lines the run says about a model's own train_step and test_step,
with what each takes its loss with, read from its code, at N > 1 replicas.

Under tf.distribute Keras divides the losses it reduces by the replica
count (self.compute_loss, a keras.losses.Loss of a mean reduction), so
that the replicas' summed gradients are the global batch's; a loss tracker
(a keras.metrics.Mean) fed such a loss then reports 1/N of one device's,
under fit with MirroredStrategy too. A mean taken by hand (keras.ops.mean,
tf.reduce_mean) is not divided: the tracker reports one device's value,
and the replicas train on N times its gradient. Which of the two a tracker
is fed, dist_keras cannot tell from outside (it would have to know what
the step differentiates), so neither is changed: the run says which the
code names.
"""
import dis
import types

import keras

from dist_keras.contract.checks import overrides

# The reductions Keras divides by the replicas (keras/src/losses/loss.py).
_DIVIDED = ("sum_over_batch_size", "mean", "mean_with_sample_weight")
# Names of a hand-taken mean, and of a step that divides its loss itself.
_MEANS = ("mean", "reduce_mean")
_DIVIDES = ("num_replicas_in_sync", "compute_average_loss",
            "scale_loss_for_distribution")


def divided_losses(model, method: str) -> list[str]:
  """What the model's `method` reaches that Keras divides by the replicas:
  'self.compute_loss', 'self.NAME (LossClass)' for a Loss attribute."""
  names = self_attributes(model, method)
  found = ["self.compute_loss"] if "compute_loss" in names else []
  attributes = vars(model)
  compiled = attributes.get("_compile_loss")  # Said as compute_loss.
  for name in sorted(names):
    value = attributes.get(name)
    if (isinstance(value, keras.losses.Loss) and value is not compiled
        and getattr(value, "reduction", None) in _DIVIDED):
      found.append(f"self.{name} ({type(value).__name__})")
  return found


def takes_a_mean_by_hand(model, method: str = "train_step") -> bool:
  """Whether `method` names a mean (keras.ops.mean, tf.reduce_mean) but
  no loss Keras divides and no division by the replicas of its own."""
  names = reached_names(model, method)
  return (any(n in names for n in _MEANS)
          and not any(n in names for n in _DIVIDES)
          and not divided_losses(model, method))


def own_steps_notes(model, replicas: int) -> list[str | None]:
  """[the line of an own train_step, the line of an own test_step whose
  loss Keras divides, the line of a train_step's mean taken by hand] at
  `replicas`, None for each the model has not."""
  train = test = None
  if overrides(model, "train_step"):
    clause = divided_note(model, "train_step", replicas)
    train = (f"{type(model).__name__}.train_step is the model's own: it runs"
             " as written on every replica (gradients all-reduced in its "
             "optimizer's apply); the sync breakdown splits its steps into "
             "input wait and model step only, and there is no calibration"
             + (f"; {clause}" if clause else ""))
  said = (divided_note(model, "test_step", replicas)
          if overrides(model, "test_step") else "")
  if said:
    test = f"{type(model).__name__}.test_step is the model's own: {said}"
  return [train, test, hand_mean_note(model, replicas) or None]


def divided_note(model, method: str, replicas: int) -> str:
  """The clause for a step whose loss Keras divides ('' if none)."""
  found = divided_losses(model, method)
  if replicas <= 1 or not found:
    return ""
  value = "the loss" if method == "train_step" else "val_loss"
  return (f"the loss its {' and '.join(found)} returns is divided by the "
          f"{replicas} replicas, as under fit (a tracker fed it reports "
          f"1/{replicas} of {value}: feed it loss * {replicas})")


def hand_mean_note(model, replicas: int) -> str:
  """The line for a train_step that takes its loss as a mean by hand ('' if
  it does not, as far as its code tells): the fix first; why, and what
  else is looked for, in docs/own_models.md's "Your own train_step"."""
  if replicas <= 1 or not takes_a_mean_by_hand(model):
    return ""
  names = reached_names(model, "train_step")
  mean = "tf.reduce_mean" if "reduce_mean" in names else "keras.ops.mean"
  return (f"divide {type(model).__name__}.train_step's loss by "
          "self.distribute_strategy.num_replicas_in_sync if it is a "
          f"{mean} ({replicas} replicas: {replicas}x one device's "
          "gradient, as under fit): own_models.md, Your own train_step")


def reached_names(model, method: str, depth: int = 4) -> set[str]:
  """The names the model's `method` loads, and those of the functions and
  methods it names, `depth` calls down (super()'s included)."""
  return _reached(model, method, _names_in, depth)


def _reached(model, method: str, read, depth: int) -> set[str]:
  """What `read(code)` finds in the model's `method` and in the methods
  (of any class in the MRO: super()'s too) it names so and the functions
  it names, `depth` calls down; `read` returning None passes a function
  by."""
  seen, found, todo = set(), set(), [(getattr(type(model), method), depth)]
  while todo:
    fn, left = todo.pop()
    code = getattr(fn, "__code__", None)
    if code is None or code in seen or left < 0:
      continue
    seen.add(code)
    own = read(code)
    if own is None:
      continue
    found |= own
    callees = [klass.__dict__[name] for name in own
               for klass in type(model).__mro__ if name in klass.__dict__]
    callees += [getattr(fn, "__globals__", {}).get(name)
                for name in _names_in(code)]
    todo.extend((c, left - 1) for c in callees
                if isinstance(c, types.FunctionType))
  return found


def _names_in(code) -> set[str]:
  """The names a code object and the functions nested in it load."""
  names = set(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      names |= _names_in(const)
  return names


def self_attributes(model, method: str, depth: int = 4) -> set[str]:
  """The attributes the model's `method` reads off the model (`self.NAME`,
  `super().NAME`), and those the methods it reads so and the functions it
  names read off their first argument (`guide_step(self, data)`'s model),
  `depth` calls down: not another object's (`self.teacher.compute_loss`),
  nor a name in a comment or a string."""
  return _reached(model, method, lambda code: _read_off(
      code, code.co_varnames[0]) if code.co_argcount else None, depth)


def _read_off(code, this: str) -> set[str]:
  """The attribute names `code` (and the functions nested in it) loads off
  the variable `this` or off super()."""
  names, on_this, calling_super = set(), False, False
  for op in dis.get_instructions(code):
    if op.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
      if on_this or op.opname == "LOAD_SUPER_ATTR":
        names.add(op.argval)
      on_this = False
    elif op.opname.startswith(("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE")):
      on_this = op.argval == this
    elif op.opname == "LOAD_GLOBAL" and op.argval == "super":
      calling_super = True
    elif op.opname in ("PRECALL", "KW_NAMES", "CACHE"):
      continue  # (3.11's: the call that follows is what counts.)
    elif op.opname == "CALL" and calling_super:
      on_this, calling_super = True, False
    else:
      on_this = False
  for const in code.co_consts:
    if isinstance(const, types.CodeType) and this in const.co_freevars:
      names |= _read_off(const, this)
  return names
