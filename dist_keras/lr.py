"""The learning rate for a batch size: Goyal et al. (2017) scaling + warmup.

"Accurate, Large Minibatch SGD" (Goyal et al., 2017): when the global batch
grows k times, multiply the learning rate by k (linear scaling), and reach
that rate by a linear ramp from the unscaled rate over the first steps
(gradual warmup), because the scaled rate is too large for the untrained
network. The ramp is a Keras LearningRateSchedule of the optimizer's own
`iterations`, so it runs inside tf.function, under any strategy and any
steps_per_loop, and a resumed run continues it exactly: `iterations` is in
the checkpoint, and the schedule holds no state of its own.
"""
import math

import keras

from dist_keras.errors import UserError, check_choice

# Factor applied to train.learning_rate for a global batch `ratio` times
# train.base_batch_size.
SCALINGS = {
    "none": lambda ratio: 1.0,
    "linear": lambda ratio: ratio,
    "sqrt": math.sqrt,
}


def check(train_cfg) -> None:
  """Raises UserError for a bad lr_scaling, base_batch_size or warmup."""
  check_choice("train.lr_scaling", train_cfg.lr_scaling, SCALINGS)
  if train_cfg.base_batch_size < 1:
    raise UserError(f"train.base_batch_size={train_cfg.base_batch_size} must "
                    "be >= 1 (the global batch train.learning_rate is for).")
  if train_cfg.warmup_steps < 0:
    raise UserError(f"train.warmup_steps={train_cfg.warmup_steps} must be "
                    ">= 0.")
  if train_cfg.warmup_steps > train_cfg.steps:
    raise UserError(f"train.warmup_steps={train_cfg.warmup_steps} is more "
                    f"than train.steps={train_cfg.steps}; use at most "
                    f"{train_cfg.steps}.")
  if train_cfg.warmup_steps and train_cfg.lr_scaling == "none":
    raise UserError(f"train.warmup_steps={train_cfg.warmup_steps} does "
                    "nothing with train.lr_scaling='none' (warmup ramps from "
                    "learning_rate to the scaled rate); set lr_scaling to "
                    "linear or sqrt, or warmup_steps=0.")


def factor(train_cfg) -> float:
  """What train.lr_scaling multiplies train.learning_rate by."""
  ratio = train_cfg.global_batch_size / train_cfg.base_batch_size
  return SCALINGS[train_cfg.lr_scaling](ratio)


def peak(train_cfg) -> float:
  """The learning rate after warmup: learning_rate scaled for the batch."""
  return train_cfg.learning_rate * factor(train_cfg)


def scheduled(train_cfg) -> bool:
  """Whether the rate depends on the batch or the step (else a constant)."""
  return train_cfg.lr_scaling != "none" or train_cfg.warmup_steps > 0


def learning_rate(train_cfg):
  """The optimizer's `learning_rate` argument.

  A plain float when nothing is scaled: the optimizer, its checkpoints and
  its speed are then exactly what they were before scaling existed.
  """
  check(train_cfg)
  if not scheduled(train_cfg):
    return train_cfg.learning_rate
  return WarmupToPeak(train_cfg.learning_rate, peak(train_cfg),
                      train_cfg.warmup_steps)


def describe(train_cfg) -> str | None:
  """One line for the start of a run, or None when nothing is scaled."""
  if not scheduled(train_cfg):
    return None
  cfg = train_cfg
  line = (f"learning rate {cfg.learning_rate:g} x {factor(cfg):.4g} "
          f"({cfg.lr_scaling}, batch {cfg.global_batch_size} / "
          f"{cfg.base_batch_size}) = {peak(cfg):.4g}")
  if cfg.warmup_steps:
    line += f", warmup {cfg.warmup_steps} steps from {cfg.learning_rate:g}"
  return line


def last_applied(optimizer) -> float:
  """The rate the optimizer's last update used (at iterations - 1).

  A scheduled optimizer's `learning_rate` is the rate of its NEXT update;
  a log line at step s describes the steps up to s, so it shows s's rate.
  """
  # float16: the LossScaleOptimizer's inner optimizer holds the schedule.
  optimizer = getattr(optimizer, "inner_optimizer", optimizer)
  schedule = optimizer._learning_rate  # pylint: disable=protected-access
  if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
    step = max(int(optimizer.iterations.numpy()) - 1, 0)
    return float(keras.ops.convert_to_numpy(schedule(step)))
  return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


@keras.saving.register_keras_serializable(package="dist_keras")
class WarmupToPeak(keras.optimizers.schedules.LearningRateSchedule):
  """`initial` at step 0, rising linearly to `peak` at `warmup_steps`, then
  `peak` (Goyal et al. 2017's gradual warmup, from eta to k * eta).

  `step` is the optimizer's `iterations` before the update, so update 1
  uses `initial` and update warmup_steps + 1 is the first at `peak`.
  """

  def __init__(self, initial: float, peak: float, warmup_steps: int):
    self.initial = float(initial)
    self.peak = float(peak)
    self.warmup_steps = int(warmup_steps)

  def __call__(self, step):
    peak = keras.ops.convert_to_tensor(self.peak, "float32")
    if not self.warmup_steps:
      return peak
    step = keras.ops.cast(step, "float32")
    done = keras.ops.minimum(step / float(self.warmup_steps), 1.0)
    ramp = self.initial + (self.peak - self.initial) * done
    # Exactly `peak` after warmup, not `peak` up to float32 rounding.
    return keras.ops.where(step >= self.warmup_steps, peak, ramp)

  def get_config(self) -> dict:
    return {"initial": self.initial, "peak": self.peak,
            "warmup_steps": self.warmup_steps}
