"""Trains tests/parity_task.py's models with Keras' fit or with dist_keras
and saves their weights and evals (for tests/training/test_fit_parity.py).

  python tests/scripts/parity_weights.py --runs=fit,one,resumed \\
      --out='one_{run}.npz'
  python tests/scripts/parity_weights.py --strategy=mirrored --devices=2 \\
      --runs=one,resumed --out='m2_{run}.npz'

A process holds one replica count (and fit runs on one device): each run
of --runs writes its own file, `{run}` in --out. Under
tools/launch_local.py (--strategy=multi_worker_mirrored) every worker writes
its own, `{task}` in --out becoming its TF_CONFIG task index.
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

STEPS = 12
# name -> parity_task's dataset_fn for it (its model_fn has the name).
MODELS = {
    "plain": "dataset_fn", "accumulate": "dataset_fn", "ema": "dataset_fn",
    "global_clipnorm": "dataset_fn", "clipnorm": "dataset_fn",
    "clipvalue": "dataset_fn", "loss_scale": "dataset_fn",
    "schedule": "dataset_fn", "weight_decay": "dataset_fn",
    "custom_step": "dataset_fn", "custom_loss": "dataset_fn",
    "two_output": "two_output_dataset_fn",
    "gan": "images_dataset_fn", "callbacks_model": "dataset_fn",
    "embedding_adam": "tokens_dataset_fn",
    "embedding_global_clipnorm": "tokens_dataset_fn",
    "embeddings_mixed": "tokens_dataset_fn",
    "positions_adam": "tokens_dataset_fn",
    "sparse_adam": "bags_dataset_fn", "sparse_own_step": "bags_dataset_fn",
    "gan_unflagged": "images_dataset_fn", "vae": "images_dataset_fn",
    "gan_unbuilt": "images_dataset_fn", "gan_held": "images_dataset_fn",
    "endpoint": "endpoint_dataset_fn",
}
# callbacks_model trains with parity_task.callbacks_fn (EarlyStopping,
# ReduceLROnPlateau, ModelCheckpoint to $PARITY_BEST) in epochs of 4 steps,
# as fit(epochs=8, steps_per_epoch=4, validation_steps=4) does.
EPOCH, EPOCHS, EVAL_STEPS = 4, 8, 4
# The models whose eval a test compares (two outputs' losses and metrics,
# a Loss added in the call, the callbacks' val_loss): the others train
# without an eval split (dataset_fn('eval', ...) None, as fit without
# validation_data), since tracing an eval cost more than their 12 steps.
# An eval of Embeddings at 2 replicas: test_fit_parity's in-process
# tests; of sparse features: tests/contract/test_composite_inputs.py.
EVALUATED = ("two_output", "endpoint", "callbacks_model")


def config(name: str, devices: int, strategy: str,
           checkpoint_every: int = STEPS) -> dict:
  """The run's config: as cheap as the comparison allows (one log window
  per half, no TensorBoard, the eval at the end); a model's own train_step
  keeps its timed steps (the path that times it)."""
  c = {"train.steps": STEPS, "train.global_batch_size": 48,
       "train.log_every": STEPS // 2, "train.checkpoint_every": checkpoint_every,
       "eval.every": 0, "log.progress": False, "log.tensorboard": False,
       "log.sync_timing": name == "custom_step",
       "log.calibration_steps": 0, "log.peak_tflops": 1.0,
       "runtime.strategy": strategy, "runtime.num_cpu_devices": devices}
  if name == "callbacks_model":
    c.update({"train.steps": EPOCH * EPOCHS, "train.log_every": EPOCH,
              "eval.every": EPOCH, "eval.steps": EVAL_STEPS})
  return c


def weights(name: str, model) -> dict:
  """{NAME/INDEX/LEAF: value}: layer names depend on what the process
  built before, so weights are matched by position."""
  return {f"{name}/{i}/{w.path.split('/')[-1]}": w.numpy()
          for i, w in enumerate(model.weights)}


def with_fit(name: str) -> dict:
  """Keras' fit on one device, the same batches; then evaluate on the whole
  eval split as one batch of arrays (exact: Keras' evaluate on a tf.data
  dataset weighs per-output losses by batches, and halves them for a
  dataset of one batch)."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  model = getattr(parity_task, name)()
  initial = {f"initial/{k}": v for k, v in weights(name, model).items()}
  make = getattr(parity_task, MODELS[name])
  one = tf.distribute.InputContext()
  if name == "callbacks_model":
    history = model.fit(make("train", one), epochs=EPOCHS,
                        steps_per_epoch=EPOCH, verbose=0, shuffle=False,
                        validation_data=make("eval", one),
                        validation_steps=EVAL_STEPS,
                        callbacks=parity_task.callbacks_fn())
    out = _stopped(name, model, len(history.epoch) * EPOCH,
                   history.history)
  else:
    model.fit(make("train", one), epochs=1, steps_per_epoch=STEPS,
              verbose=0, shuffle=False)
    out = _evaluated(name, model, make) if name in EVALUATED else {}
  return {**initial, **weights(name, model), **out}


def _evaluated(name, model, make) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top
  if getattr(model, "loss", None) is None:
    return {}
  (x, y), = make("eval", tf.distribute.InputContext()).unbatch().batch(
      parity_task.SIZES["eval"])
  return {f"eval/{name}/{key}": value for key, value in model.evaluate(
      x, y, batch_size=parity_task.SIZES["eval"], verbose=0,
      return_dict=True).items()}


def _stopped(name, model, steps, history) -> dict:
  """Where the callbacks stopped it, its last rate, its val losses and the
  best model ModelCheckpoint kept."""
  import keras  # pylint: disable=g-import-not-at-top
  best = keras.models.load_model(os.environ["PARITY_BEST"])
  return {f"steps/{name}": steps,
          f"lr/{name}": float(model.optimizer.learning_rate.numpy()),
          f"val_loss/{name}": history["val_loss"],
          **{f"best/{k}": v for k, v in weights(name, best).items()}}


class Interrupted(Exception):
  pass


def interrupt_at(step: int):
  """A callback that stops the run with an exception once `step` steps
  have run: nothing after the last checkpoint is saved, and the next fit
  call builds a new model and optimizer, so only the checkpoint carries
  state across (real SIGKILLs: tests/training/test_resume.py)."""
  import keras  # pylint: disable=g-import-not-at-top

  class Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if batch + 1 >= step:  # One epoch: the batch is the step.
        raise Interrupted(f"after step {batch + 1}")

  return Interrupt()


def dataset_fn(name: str):
  """parity_task's dataset_fn of model `name`, by name where a test
  compares its eval, else its train split alone (no eval split)."""
  if name in EVALUATED:
    return f"parity_task:{MODELS[name]}"
  import parity_task  # pylint: disable=g-import-not-at-top
  make = getattr(parity_task, MODELS[name])

  def train_only(split, input_context):
    return None if split == "eval" else make(split, input_context)

  return train_only


def with_dist_keras(name: str, args, workdir: str, interrupt: int) -> dict:
  """dist_keras.fit of `name`; with `interrupt`, stopped after that step
  and run again to resume from the checkpoint before."""
  import dist_keras  # pylint: disable=g-import-not-at-top
  import parity_task  # pylint: disable=g-import-not-at-top
  from dist_keras.training import checkpoints  # pylint: disable=g-import-not-at-top
  settings = config(name, args.devices, args.strategy,
                    4 if interrupt else STEPS)
  callbacks = parity_task.callbacks_fn() if name == "callbacks_model" else []
  out = {}
  if interrupt:
    try:
      dist_keras.fit(f"parity_task:{name}", dataset_fn(name),
                     workdir=workdir, config=settings,
                     callbacks=[interrupt_at(interrupt)])
    except Interrupted:
      out[f"resumed_from/{name}"] = checkpoints.find_resume(workdir).step
  result = dist_keras.fit(
      f"parity_task:{name}", dataset_fn(name), workdir=workdir,
      config=settings, callbacks=callbacks or None)
  out.update(weights(name, result.model))
  if name == "callbacks_model":
    return {**out, **_stopped(name, result.model, result.summary["steps"],
                              result.history)}
  for key, value in result.summary.items():
    if key.startswith("eval_") and key != "eval_examples":
      out[f"eval/{name}/{key[len('eval_'):]}"] = value
  out[f"sync_split/{name}"] = str(result.summary["sync_split"])
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--runs", default="one",
                      help="comma-separated: fit (Keras' fit on one device), "
                      "one (dist_keras), resumed (stopped after "
                      "--interrupt_at steps, then resumed)")
  parser.add_argument("--strategy", default="one_device")
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--resumed_models", default=",".join(MODELS))
  parser.add_argument("--interrupt_at", type=int, default=7)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  from dist_keras.distribute import tfconfig  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  cluster = tfconfig.from_env()
  for run in args.runs.split(","):
    out = {}
    names = args.resumed_models if run == "resumed" else args.models
    for name in names.split(","):
      if run == "fit":
        out.update(with_fit(name))
        continue
      with tempfile.TemporaryDirectory() as workdir:
        out.update(with_dist_keras(
            name, args, workdir,
            args.interrupt_at if run == "resumed" else 0))
    np.savez(args.out.format(run=run, task=cluster.task_index if cluster
                             else 0), **out)


if __name__ == "__main__":
  main()
