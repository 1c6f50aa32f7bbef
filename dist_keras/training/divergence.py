"""A non-finite loss: stop (exit 3), or go back to the last checkpoint and
on past the batches that diverged (train.divergence_retries, as orbit's
RecoveryAction does)."""
import os

import numpy as np

from dist_keras import errors
from dist_keras.distribute import leaving
from dist_keras.training import steps


def check(run, out: dict, optimizer, checkpoints) -> None:
  """Raises errors.Diverged at the first non-finite loss or gradient
  (a model's own step: at the first non-finite value in its logs).

  Under float16 loss scaling an overflowing gradient is expected now and
  then: the update skipped it and halved the scale (counted in
  run.skipped_steps). Only a non-finite loss, or a scale driven below 1
  (the gradients overflow even unscaled), is divergence there.
  """
  if "finite" in out:
    if bool(out["finite"]):
      return
    logs = {k: np.asarray(v).tolist() for k, v in run.step_logs.items()}
    what = f"the model's train_step returned {logs}"
  else:
    loss, finite = float(out["loss"]), bool(out["finite_grads"])
    skipped = int(out["skipped"])
    run.skipped_steps += skipped
    scale = steps.loss_scale_of(optimizer)
    if skipped and np.isfinite(loss) and float(scale.numpy()) >= 1.0:
      return
    if np.isfinite(loss) and finite:
      return
    what = f"loss {loss}" if finite else f"non-finite gradients (loss {loss})"
  # The loss, gradients and logs are all-reduced: every worker stops here,
  # together (met first). One leaving at once could cut a peer's last
  # receive of this step's all-reduce; none reports it to the others.
  together = run.multi_worker and not run.retries_left
  kept, rerun = ((f"the last good checkpoint "
                  f"({os.path.basename(checkpoints.last_saved())}) is kept",
                  "rerun to resume from it")
                 if checkpoints.saved_at is not None else
                 ("no checkpoint was saved before it", "rerun from step 0"))
  error = errors.Diverged(
      f"{what} at step {run.step}: training diverged; {kept}. Lower the "
      "learning rate or clip the gradient norm (train.global_clipnorm, or "
      f"the optimizer's global_clipnorm), then {rerun}.")
  raise leaving.refused_together(error) if together else error


def go_back(run, checkpoints, why: str) -> str:
  """Back to the last checkpoint's weights, on past the batches that
  diverged (the step count stays the batches read, so a resume reads what
  this run reads); returns the line that says so."""
  run.retries_left -= 1
  saved_at = checkpoints.saved_at
  path = checkpoints.go_back()
  run.skipped.append([saved_at + 1, run.step])
  return (f"{why.split(':')[0]}: back to {os.path.basename(path)}, "
          f"skipping batches {saved_at + 1}-{run.step} "
          f"({run.retries_left} retries left)")
