"""What a run changes in its Python process, put back as it ends: a
notebook's next cell, or a sweep's next run, finds the process as the run
found it, as after Keras' own fit.

- The global random generators (Python's, NumPy's, TensorFlow's global
  seed and Keras' seed and SeedGenerator): the run seeds them with
  runtime.seed at build, so its weights, dropout and data order are the
  same on every rerun and a resume is exact; left seeded, a notebook's
  random search drew the same values after every fit.
- The hooks on the optimizers (compiled.prepare_optimizers): left on, the
  returned model trained on by Keras' fit under the same strategy skipped
  the gradient all-reduce, its replicas' copies drifting apart silently.
- Keras' division of a reduced Loss by the replicas, which skips a Loss
  reduced in the model's call in the run's steps (call_losses.install).
- The root logger: TensorFlow's checkpoint writer logs through absl, which
  calls logging.basicConfig() while the root logger has no handler (a
  notebook's, a plain script's): every TensorFlow warning then printed
  twice, and the user's own logging.basicConfig(...) did nothing
  (root_logger_kept).
- The file paths of the users' Keras callbacks, which a worker other than
  the chief points into its scratch folder (user_callbacks.for_worker):
  left so, a notebook's next model.fit with the same callbacks wrote in
  a folder deleted at the run's end.

api.build makes the stack (`kept`); the Trainer's close, or a build that
fails, closes it.
"""
import contextlib
import logging
import random

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from dist_keras import installation
from dist_keras.training import call_losses

_HERE = "dist_keras/training/process_state.py"


def kept(seed: int) -> contextlib.ExitStack:
  """The process as the run found it, put back when the stack closes: the
  global random generators, seeded with `seed` meanwhile, Keras' division
  of a Loss by the replicas and the root logger (root_logger_kept)."""
  stack = contextlib.ExitStack()
  stack.enter_context(root_logger_kept())
  stack.enter_context(seeded(seed))
  stack.callback(call_losses.install())
  return stack


@contextlib.contextmanager
def seeded(seed: int):
  """keras.utils.set_random_seed(seed) in the block; then every generator
  it seeds goes on from the state it had before, as if the block had not
  drawn from it (unseeded ones stay unseeded)."""
  with undrawn(), _keras_seed_kept():
    keras.utils.set_random_seed(seed)
    yield


@contextlib.contextmanager
def undrawn():
  """Python's and NumPy's global generators, and TensorFlow's global seed
  and op seeds, go on after the block from the state they had before it,
  as if nothing in the block had drawn from them."""
  python, numpy, tf_state = (random.getstate(), np.random.get_state(),
                             _tf_state())
  try:
    yield
  finally:
    random.setstate(python)
    np.random.set_state(numpy)
    _set_tf_state(*tf_state)


@contextlib.contextmanager
def _keras_seed_kept():
  """The globals of keras.src that set_random_seed writes, as they were
  before the block: its seed, and the SeedGenerator keras.random draws
  from without a seed of their own."""
  from keras.src.backend.common import global_state  # pylint: disable=g-import-not-at-top
  from keras.src.random import seed_generator  # pylint: disable=g-import-not-at-top
  from keras.src.utils import rng_utils  # pylint: disable=g-import-not-at-top
  get, put = (installation.require(global_state, f"{verb}_global_attribute",
                                   "Keras' global state", _HERE)
              for verb in ("get", "set"))
  keys = (installation.require(rng_utils, "GLOBAL_RANDOM_SEED",
                               "Keras' global seed", _HERE),
          installation.require(seed_generator, "GLOBAL_SEED_GENERATOR",
                               "Keras' global SeedGenerator", _HERE))
  saved = {key: get(key) for key in keys}
  try:
    yield
  finally:
    for key, value in saved.items():
      put(key, value)


def _tf_state():
  """TensorFlow's global seed (None: unset) and the state of the generator
  that draws an op's seed from it, as tf.random.set_seed left them."""
  ctx = context.context()
  rng = getattr(ctx, "_rng", None)  # (Made by the first set_seed.)
  return context.global_seed(), rng.getstate() if rng else None


def _set_tf_state(seed, rng_state) -> None:
  tf.random.set_seed(seed)  # None: unseeded again; clears its op caches.
  if rng_state is not None:
    installation.require(context.context(), "_rng",
                         "TensorFlow's op seeds", _HERE).setstate(rng_state)


@contextlib.contextmanager
def root_logger_kept():
  """The root logger without handlers stays so through the block, though
  absl logs in it: absl (TensorFlow's checkpoint writer logs through it)
  calls logging.basicConfig() when the root logger has no handler, after
  which every TensorFlow warning printed twice (its own handler's and the
  root's) and the user's own logging.basicConfig(...) did nothing. A
  stand-in handler keeps it from firing and does what Python does for a
  record no handler takes. A root logger with handlers (the command
  line's absl handler, the user's) is left as it is."""
  root = logging.getLogger()
  if root.handlers:
    yield
    return
  tf.get_logger()  # Its own handler, added only while the root has none.
  stand_in = _AsIfNoHandler()
  root.addHandler(stand_in)
  try:
    yield
  finally:
    root.removeHandler(stand_in)


class _AsIfNoHandler(logging.Handler):
  """Hands a record that no other handler on its way to the root takes to
  logging.lastResort (WARNING and above, on stderr), as Python would with
  no handler on the root."""

  def emit(self, record):
    logger = logging.getLogger(record.name)
    while logger is not None:
      if any(handler is not self for handler in logger.handlers):
        return
      logger = logger.parent if logger.propagate else None
    last = logging.lastResort
    if last is not None and record.levelno >= last.level:
      last.handle(record)
