"""Keras' fit arguments, which dist_keras.fit does not take: each with what
does its work here (a config key, or the dataset_fn), so a Keras user's
habit is refused in one line that says where it went. Nothing here imports
TensorFlow."""
import functools

from dist_keras.errors import UserError

# Keras' fit argument -> what sets it in dist_keras (configs/base.py keys).
KERAS_FIT_ARGS = {
    "epochs": "config={'train.steps': N} (the run's length in steps; an "
              "epoch is eval.every steps)",
    "steps_per_epoch": "config={'eval.every': N} (the steps between evals, "
                       "dist_keras' epoch)",
    "initial_epoch": "the same workdir again (a rerun resumes from its last "
                     "checkpoint)",
    "batch_size": "config={'train.global_batch_size': N} (dataset_fn batches"
                  " input_context.get_per_replica_batch_size(N))",
    "verbose": "config={'log.progress': False} (or True)",
    "shuffle": "ds.shuffle(buffer, seed=...) in dataset_fn",
    "class_weight": "sample weights from dataset_fn (ds.map(lambda x, y: (x, "
                    "y, tf.gather(class_weights, y))))",
    "sample_weight": "(x, y, sample_weight) batches from dataset_fn",
    "validation_data": "dataset_fn's 'eval' split",
    "validation_split": "dataset_fn's 'eval' split (split your data there)",
    "validation_batch_size": "dataset_fn's 'eval' split (its batches)",
    "validation_freq": "config={'eval.every': N} (in steps)",
    "validation_steps": "config={'eval.steps': N}",
}


def refusing_keras_args(fit):
  """`fit`, refusing Keras' fit arguments first; its signature and help
  stay its own, and any other unknown keyword is Python's TypeError."""

  @functools.wraps(fit)
  def checked(*args, **kwargs):
    for name in kwargs:
      if name in KERAS_FIT_ARGS:
        raise UserError(
            f"dist_keras.fit takes no {name}= (Keras' fit does); use "
            f"{KERAS_FIT_ARGS[name]}; see help(dist_keras.fit).")
    return fit(*args, **kwargs)

  return checked
