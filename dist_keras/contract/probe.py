"""The model against its batches (called as model_calls.py calls it),
met once, before training: a zero batch of each split through the model,
its compiled loss and metrics (which builds their state, and a subclassed
model's weights, in scope), checked as Keras' fit would find them at its
first step or eval. What the model made of the train split's zero batch
is kept as a `Probe`, which the training's own checks of the model against
its batches read (training/batch_losses.py, training/varying_slices.py)
instead of calling the model again.

Every check here raises UserError with one line naming the bad value and
the fix, before anything is written to the workdir.
"""
import dataclasses

import keras
import tensorflow as tf

from dist_keras import errors
from dist_keras.contract import batches, checks, features, model_calls
from dist_keras.errors import UserError


@dataclasses.dataclass(frozen=True)
class Probe:
  """What the model made of its batches (meet()).

  Attributes:
    spec: the train split's element spec (its batches' structure and
      shapes, sizes it leaves open as None).
    x, y, sample_weight: a zero batch shaped like `spec`, as the compiled
      loss takes it (y: zeros shaped like the prediction where the batches
      have no labels); None where the model was not probed (built, with no
      compiled loss or metrics to build from a batch).
    y_pred: the model's prediction of `x` (zeros of its shapes), or None.
    no_eval: None where the eval has a loss to report, else the line that
      says there is none.
  """
  spec: object
  x: object = None
  y: object = None
  sample_weight: object = None
  y_pred: object = None
  no_eval: str | None = None

  @property
  def evaluates(self) -> bool:
    """Whether the eval has a loss to report."""
    return self.no_eval is None


def meet(model, layers: list, strategy, batch_spec, eval_spec=None,
         builtin_data: str | None = None) -> Probe:
  """Creates the model's variables and its compiled loss's and metrics'
  state, in scope, from a zero batch shaped like `batch_spec`; then checks
  that the variables are mirrored. `layers`: the layers inside the model
  (installation.layers_in), as it came from model_fn.
  Returns the Probe: what the model made of the train split's zero batch,
  and whether the eval has a loss to report.

  Keras creates metric variables on their first update; inside a replica
  function that is not allowed, so they are made here (as Keras' own fit
  does symbolically), and so are a subclassed model's weights. It also
  checks that the model, its loss and metrics accept the dataset's batches:
  the train split's, and the eval split's (`eval_spec`) where Keras'
  test_step will read them (else found only at the first eval).
  `builtin_data` names the built-in data the batches come from, if they do.
  """
  # Built, no compiled loss or metrics: nothing to build from a batch (a
  # GAN, whose batches need not be its call's inputs), as under Keras' fit.
  probed = not _built(model, layers) or _compiled_from_data(model)
  met = Probe(batch_spec)
  if probed:
    with strategy.scope():
      met, loss = _probe(model, batch_spec, "train", builtin_data)
  has_eval_loss = evaluates(model, strategy, batch_spec, eval_spec)
  if probed:
    if (eval_spec is not None and has_eval_loss
        and not checks.overrides(model, "test_step")):
      batches.check_batched_like(eval_spec, batch_spec)
      with strategy.scope():
        _probe(model, eval_spec, "eval", builtin_data)
    _check_scalar(model, loss)
    model.reset_metrics()
  _check_in_scope(model, layers, strategy)
  no_eval = None if has_eval_loss else _no_eval_note(model)
  return dataclasses.replace(met, no_eval=no_eval)


def _no_eval_note(model) -> str:
  """Keras' evaluate() would fail on such a model: there is no eval."""
  return (f"no eval: {type(model).__name__} has no compiled loss, no "
          "test_step of its own and no loss of its own (add_loss, "
          "regularisers) in a call on the eval batches, so Keras' evaluate()"
          " would have none to report")


def evaluates(model, strategy, batch_spec, eval_spec=None) -> bool:
  """Whether the eval has a loss to report, as Keras' evaluate() finds
  one: its own test_step's, or Keras' test_step's compiled loss or the
  model's own losses (add_loss terms, regularisers) on the eval batches.
  A GAN (its own train_step, no loss; its call does not take the batches)
  has none: evaluate() would fail on it.

  Raises:
    UserError: a model trained by Keras' train_step that has no loss at
      all (its first step would fail: "No loss to compute").
  """
  if (checks.overrides(model, "test_step")
      or checks.overrides(model, "compute_loss") or model.loss is not None):
    return True
  eval_spec = batch_spec if eval_spec is None else eval_spec
  if checks.overrides(model, "train_step"):
    return bool(model_calls.adds_losses(model, strategy, eval_spec,
                                        training=False))
  if model_calls.adds_losses(model, strategy, batch_spec,
                             training=True) is False:
    raise UserError(
        f"model {model.name!r} has no loss to train on: it was compiled "
        "without a loss and adds none of its own (add_loss() in its call, "
        "weight regularisers); compile the model with a loss= or add_loss()"
        " in its call (or give it a train_step of its own).")
  # A call that fails on the eval batches (None) is said by their probe.
  return model_calls.adds_losses(model, strategy, eval_spec,
                                 training=False) is not False


def _probe(model, batch_spec, split: str, builtin_data: str | None):
  """(the Probe, the compiled loss (None without one)) of a zero batch
  shaped like `batch_spec`, the metrics updated; UserError if they cannot
  take it. Batches a model's own step reads are its business, as under
  fit: only Keras' steps need labels for a compiled loss, and x for the
  Inputs."""
  where, fix = f"dataset_fn({split!r}, ...)", ""
  if builtin_data:  # A user's model on the config's data: say whose.
    where = f"the built-in data.name={builtin_data!r} ({split} split)"
    fix = ("; build the model for these batches, or give it your own data "
           "(data.name=PKG.MODULE:FN)")
  x, y, weights = keras.utils.unpack_x_y_sample_weight(
      batches.zeros(model_calls.shaped_by_inputs(model, batch_spec)))
  step = "train_step" if split == "train" else "test_step"
  if checks.overrides(model, step):
    fix += "" if y is not None else (
        f"; {type(model).__name__}.{step} takes batches without labels: "
        "dist_keras builds the compiled loss and metrics before training (a"
        " replica cannot create their variables) against targets shaped "
        "like the model's prediction")
  elif y is None and getattr(model, "loss", None) is not None:
    raise UserError(
        f"{where} yields batches without labels "
        f"({batches.describe(batch_spec)}), but the compiled loss "
        f"{_loss_name(model)} needs them; yield (x, y) or "
        f"(x, y, sample_weight) batches{_split_dict(x)}.")
  else:
    features.check_input_keys(model, x, where)
  try:
    y_pred = model_calls.zero_prediction(model, x)
    y = model_calls.targets(y, y_pred)
    loss = None if model.loss is None else model_calls.compute_loss(
        model, x, y, y_pred, weights, training=False)
    model.compute_metrics(x, y, y_pred, weights)
  # Unimplemented: a cast the loss cannot make (string labels to float).
  except (ValueError, TypeError, NotImplementedError,
          tf.errors.InvalidArgumentError,
          tf.errors.UnimplementedError) as e:
    raise UserError(
        f"the model or its compiled loss/metrics cannot take the batches "
        f"of {where} ({batches.describe(batch_spec)}): "
        f"{errors.first_line(e)}{fix}") from e
  return Probe(batch_spec, x, y, weights, y_pred), loss


def _split_dict(x) -> str:
  """How to split a dict of features and label (TFDS' and CSV readers'
  habit) into (x, y); '' for other batches."""
  keys = sorted(x) if isinstance(x, dict) else []
  if len(keys) < 2:
    return ""
  label = next((k for k in keys if k in ("label", "labels", "target", "y")),
               "LABEL")
  feature = next(k for k in keys if k != label)
  return f", e.g. ds.map(lambda d: (d[{feature!r}], d[{label!r}]))"


def _check_scalar(model, loss) -> None:
  """The loss must be one number: a vector's gradient is its sum's, which
  scales with the examples per replica (N replicas would not train what
  one device trains) and is rarely what was meant."""
  rank = len(getattr(loss, "shape", ()))
  if rank:
    raise UserError(
        f"the compiled loss {_loss_name(model)} gives a tensor of rank {rank}"
        " per batch, not one number (reduction=None?); compile a loss that "
        "reduces to a scalar (Keras' default reduction, or 'sum').")


def _compiled_from_data(model) -> bool:
  """Whether compile() was given a loss or metrics (built from a batch)."""
  compiled = model.get_compile_config() or {}
  return any(compiled.get(key) is not None
             for key in ("loss", "metrics", "weighted_metrics"))


def _built(model, layers: list) -> bool:
  """Whether the model and every layer in it is built, as Keras' fit asks
  before it builds a model (a subclassed model's build(shape) leaves the
  layers its call creates weights in unbuilt). A model with a train_step
  of its own and no build() of its own, every layer inside built, has
  every variable it will have, its own flag unset or not: keras.io's GANs
  and VAE, whose call (if any) does not take the batches, as Keras' fit on
  one device trains them (calling them on a batch failed, or crashed).
  `layers`: those inside the model."""
  if not all(layer.built for layer in layers):
    return False
  return model.built or (checks.overrides(model, "train_step")
                         and not checks.overrides(model, "build"))


def _check_in_scope(model, layers: list, strategy) -> None:
  """Refuses variables created outside `strategy.scope()`: they would not
  be mirrored, so replicas would update different copies (or fail). Where
  the rest of the model is in scope, names the layer made before model_fn
  (keras.io's scripts keep augmentation layers in a list at import)."""
  def outside(variables):
    return [v for v in variables
            if not strategy.extended.variable_created_in_scope(v.value)]
  model_vars = outside(model.variables)
  if model_vars and len(model_vars) < len(model.variables):
    owner = _owner(model_vars[0], model, layers)
    raise UserError(
        f"model variable {model_vars[0].path!r} of layer "
        f"{type(owner).__name__} {owner.name!r} was created outside the "
        "strategy's scope (it is not mirrored): that layer was made before "
        "dist_keras called model_fn (at import, in a list of layers?); "
        "create it inside model_fn, with the rest of the model.")
  first = ([f"model variable {v.path!r}" for v in model_vars] + [
      f"optimizer variable {v.path!r}"
      for v in outside(model.optimizer.variables)])
  if first:
    raise UserError(
        f"{first[0]} was created outside the strategy's scope (it is not "
        "mirrored); create the model, its optimizer and compile() inside "
        "model_fn, not at import time or before dist_keras calls it.")


def _owner(variable, model, layers: list):
  """The innermost of `layers` holding `variable` (a seed generator's
  state too: Layer.variables lists them), else the model."""
  return ([model] + [layer for layer in layers
                     if any(v is variable for v in layer.variables)])[-1]


def _loss_name(model) -> str:
  loss = model.loss
  return repr(loss) if isinstance(loss, str) else type(loss).__name__
