"""The learning rate for a batch size: Goyal et al. (2017) scaling + warmup.

"Accurate, Large Minibatch SGD" (Goyal et al., 2017): when the global batch
grows k times, multiply the learning rate by k (linear scaling), and reach
that rate by a linear ramp from the unscaled rate over the first steps
(gradual warmup), because the scaled rate is too large for the untrained
network. dist_keras applies the rule to the COMPILED optimizer, a user's as
a built-in's: its constant rate is the base. The ramp is Keras' own
CosineDecay with alpha=1 (a linear warmup to `warmup_target`, then no decay),
a schedule of the batches the optimizer has applied (Keras evaluates it at
`_iterations`: with gradient accumulation, batches, not updates; see
keras_internals.applied_batches): it runs inside tf.function under any
strategy and steps_per_loop, a resumed run continues it exactly (the count
is checkpointed, the schedule holds no state), and the saved model.keras
names only Keras classes.
"""
import dataclasses

import keras

from dist_keras import validate
from dist_keras.errors import UserError
from dist_keras.training import keras_internals


def factor(train_cfg) -> float:
  """What train.lr_scaling multiplies the base rate by."""
  ratio = train_cfg.global_batch_size / train_cfg.base_batch_size
  return validate.LR_SCALINGS[train_cfg.lr_scaling](ratio)


def warmup_to(initial: float, peak: float, warmup_steps: int):
  """The rate: `initial` at update 1 rising linearly to `peak` at update
  warmup_steps + 1, then `peak` exactly (a float when there is no ramp)."""
  if not warmup_steps:
    return peak
  # alpha=1: the "decay" after warmup multiplies by exactly 1.0.
  return keras.optimizers.schedules.CosineDecay(
      initial_learning_rate=initial, decay_steps=1, alpha=1.0,
      warmup_target=peak, warmup_steps=warmup_steps)


@dataclasses.dataclass(frozen=True)
class Rate:
  """The compiled rate and the rate after warmup (None: a user's schedule);
  `asked`: this run's constant rates, {optimizer's name: rate}, before a
  resume restores the checkpoint's (kept_line)."""
  base: float | None
  peak: float | None
  line: str | None = None  # What was done, for the start of the run.
  asked: dict = dataclasses.field(default_factory=dict, compare=False)

  def kept_line(self, optimizers: dict, checkpoint: str) -> str | None:
    """The line naming each rate `checkpoint` (restored) set in place of
    this run's (an edit of model_fn's rate, a callback's change), as Keras'
    BackupAndRestore keeps it too; None where they agree."""
    kept = []
    for name, rate in self.asked.items():
      now = _constant_rate(keras_internals.inner(optimizers[name]))
      if now != rate:
        named = "" if name == "optimizer" else f"{name} "
        kept.append(f"{named}{now:g} (this run's: {rate:g})")
    if not kept:
      return None
    return (f"learning rate {', '.join(kept)} kept from {checkpoint}: a "
            "resumed run goes on with the optimizer state it saved, as "
            "under Keras' BackupAndRestore; pass a new workdir to train at "
            "this run's from step 0")


def apply(optimizers: dict, train_cfg) -> Rate:
  """Applies train.lr_scaling and warmup_steps to the compiled optimizer's
  rate (`optimizers`: {name: each optimizer the model holds}, the compiled
  one first: compiled.optimizers_of).

  Raises:
    UserError: scaling was asked for but the compiled rate is a schedule
      (its shape is the user's; dist_keras will not guess how to scale it),
      or the model's own step also steps other optimizers (which scaling
      the compiled one would leave as they are).
  """
  inner = keras_internals.inner(optimizers["optimizer"])
  base = _constant_rate(inner)
  if train_cfg.lr_scaling == "none":
    return Rate(base, base, asked=_constant_rates(optimizers))
  if len(optimizers) > 1:
    raise UserError(
        f"train.lr_scaling={train_cfg.lr_scaling!r} scales the compiled "
        f"optimizer's learning rate, but the model also holds "
        f"{', '.join(list(optimizers)[1:])}, which it would leave as they "
        "are; scale their rates in model_fn, or set train.lr_scaling=none.")
  if base is None:
    raise UserError(
        f"train.lr_scaling={train_cfg.lr_scaling!r} scales a constant "
        "learning rate, but the compiled optimizer's is a schedule; scale it "
        "in your schedule, or set train.lr_scaling=none.")
  peak = base * factor(train_cfg)
  inner.learning_rate = warmup_to(base, peak, train_cfg.warmup_steps)
  return Rate(base, peak, describe(train_cfg, base),
              _constant_rates(optimizers))


def _constant_rates(optimizers: dict) -> dict:
  """{name: rate} of the optimizers whose rate is a constant: a variable,
  which a checkpoint holds (a schedule's is computed, none is kept)."""
  rates = {name: _constant_rate(keras_internals.inner(o)) for name, o in optimizers.items()}
  return {name: rate for name, rate in rates.items() if rate is not None}


def _constant_rate(optimizer) -> float | None:
  if keras_internals.rate_schedule(optimizer) is not None:
    return None
  try:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
  except (TypeError, ValueError):  # A callable rate.
    return None


def describe(train_cfg, base: float) -> str:
  """One line for the start of a scaled run."""
  cfg = train_cfg
  line = (f"learning rate {base:g} x {factor(cfg):.4g} "
          f"({cfg.lr_scaling}, batch {cfg.global_batch_size} / "
          f"{cfg.base_batch_size}) = {base * factor(cfg):.4g}")
  if cfg.warmup_steps:
    line += f", warmup {cfg.warmup_steps} steps from {base:g}"
  return line


def last_applied(optimizer) -> float:
  """The rate the optimizer's last update used.

  A scheduled optimizer's `learning_rate` is the rate of its NEXT update;
  a log line at step s describes the steps up to s, so it shows the rate
  of the last batch applied (the schedule reads the applied batches).
  """
  schedule = keras_internals.rate_schedule(optimizer)
  if schedule is not None:
    applied = int(keras_internals.applied_batches(optimizer).numpy())
    return float(keras.ops.convert_to_numpy(schedule(max(applied - 1, 0))))
  optimizer = keras_internals.inner(optimizer)
  return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def logged_rates(optimizers: dict) -> dict:
  """TensorBoard's learning-rate scalars of the model's optimizers
  ({attribute: optimizer}, compiled.optimizers_of): `learning_rate`, the
  compiled optimizer's, as long as no other has applied a batch; else
  each that has, by its attribute, `learning_rate/d_optimizer`, and the
  compiled one as `learning_rate` only if it has too. keras.io's GANs
  compile with no optimizer (Keras' default RMSprop) and step their own:
  the compiled one's rate is then no rate the run used."""
  stepped = {name: optimizer for name, optimizer in optimizers.items()
             if int(keras_internals.applied_batches(optimizer).numpy())}
  if set(stepped) <= {"optimizer"}:
    return {"learning_rate": last_applied(optimizers["optimizer"])}
  return {"learning_rate" + ("" if name == "optimizer" else f"/{name}"):
          last_applied(optimizer) for name, optimizer in stepped.items()}
