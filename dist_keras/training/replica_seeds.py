"""Each replica draws its own random numbers from a model's SeedGenerators.

Keras 3 draws a model's random numbers (Dropout's masks, GaussianNoise,
`keras.random.normal(..., seed=self.seed_generator)` in a GAN's
`train_step`) from a `keras.random.SeedGenerator`: a state variable `[seed,
counter]` that each draw reads and steps. Under tf.distribute that variable
has a copy per replica, made alike and stepped alike, so every replica drew
the same numbers (Keras' own fit under MirroredStrategy too, checked
2026-12-06): N replicas' Dropout repeated one mask N times over the global
batch, and a GAN's latents repeated, where one device draws a new number
for every example.

Inside a dist_keras step, replica r > 0 folds r into each seed it draws
(`tf.random.experimental.stateless_fold_in`); the state is stepped as
before, so its copies stay equal (the checkpoint's one copy restores all of
them and a resumed run draws what the uninterrupted one draws), replica 0
draws what Keras draws (one device: unchanged, bitwise), and replicas of
other workers differ too (the replica id counts over every worker).

Keras reaches every SeedGenerator draw through `SeedGenerator.next` (its
`draw_seed`); dist_keras replaces that method while a replica's step is
being traced, in the tracing thread only, and puts Keras' back after
(tests/training/test_replica_seeds.py checks that a draw still goes
through it, so a Keras release that moves it fails there).
"""
import contextlib
import functools
import threading

import keras
import tensorflow as tf

_local = threading.local()
_lock = threading.Lock()
# How many replica steps are being traced now (each in its own thread under
# MirroredStrategy), and Keras' own method while any is.
_tracing = {"count": 0, "keras_next": None}


def per_replica(replica_fn):
  """`replica_fn` (what strategy.run runs), its SeedGenerator draws made
  different on each replica."""

  @functools.wraps(replica_fn)
  def drawing_per_replica(*args, **kwargs):
    with _folding():
      return replica_fn(*args, **kwargs)

  return drawing_per_replica


def folded(seed, replica):
  """`seed` (a SeedGenerator's draw, shape [2]) for replica `replica`:
  itself on replica 0, else a seed of its own (the replica folded in)."""
  static = tf.get_static_value(replica)
  if static is not None and int(static) == 0:
    return seed
  # As Keras' TF random ops read a seed: int32 (and XLA folds int32 only).
  as_int32 = tf.cast(tf.math.floormod(seed, tf.constant(
      tf.int32.max - 1, seed.dtype)), tf.int32)
  mixed = tf.cast(tf.random.experimental.stateless_fold_in(
      as_int32, tf.cast(replica, tf.int32)), seed.dtype)
  if static is not None:
    return mixed
  return tf.where(tf.cast(replica, tf.int32) > 0, mixed, seed)  # A TPU's id.


@contextlib.contextmanager
def _folding():
  generator = keras.random.SeedGenerator
  with _lock:
    if _tracing["count"] == 0:
      _tracing["keras_next"] = generator.next
      generator.next = _next
    _tracing["count"] += 1
  depth = getattr(_local, "depth", 0)
  _local.depth = depth + 1
  try:
    yield
  finally:
    _local.depth = depth
    with _lock:
      _tracing["count"] -= 1
      if _tracing["count"] == 0:
        generator.next = _tracing["keras_next"]


def _next(self, ordered=True):
  seed = _tracing["keras_next"](self, ordered=ordered)
  context = tf.distribute.get_replica_context()
  # Not a replica step of this thread (another thread's trace, or the
  # cross-replica context): Keras' own draw.
  if not getattr(_local, "depth", 0) or context is None:
    return seed
  return folded(seed, context.replica_id_in_sync_group)
