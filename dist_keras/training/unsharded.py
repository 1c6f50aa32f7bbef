"""A dataset_fn that does not shard, refused before a step trains.

dist_keras never auto-shards (distribute_datasets_from_function): each
input pipeline reads what dataset_fn returns for its input_context. One
that ignores input_context (Keras' fit shards for its user; the commonest
slip coming from it) gives every pipeline the same stream, so each step's
global batch is the first B/N examples N times over: it trained silently,
other weights than one device's on the same data (2 replicas, 20 SGD
steps: 0.043 apart where a sharded run is 6e-8 from one device reading
its global batches).

The eval split alike: unsharded, each pipeline evaluates the whole split,
every example counted N times (eval_examples and counts such as
TruePositives; means unchanged), no faster than one pipeline.

At 2 or more pipelines each pipeline's FIRST batch of a split is
fingerprinted and the fingerprints compared, across workers through one
small collective (every worker sees the same table, so all refuse
together).
The batch comes from a second call of dataset_fn for that pipeline: a new
iterator of the dataset the run trains on would draw the next seeds of its
shuffle (reshuffle_each_iteration) and shift the run's stream, and exact
resume and fit parity with it. The global generators are put back after
(process_state.undrawn), so the eval split and what follows draw as they
did. Batches whose examples are all alike (tf.zeros data) say nothing;
equal batches that repeat examples within themselves are said in a line,
not refused.
"""
import hashlib

import numpy as np
import tensorflow as tf

from dist_keras import origins, quiet
from dist_keras.contract import imports
from dist_keras.distribute import leaving, strategies
from dist_keras.errors import UserError
from dist_keras.training import allreduce, process_state

# TensorFlow's warning as an iterator that read part of a cached dataset
# goes (the probe reads one batch of a pipeline that caches): not the
# user's to see.
_PARTLY_CACHED = ("did not fully read the dataset being cached",)
# A fingerprint: (32-bit digest, examples that differ, examples); a
# pipeline whose first batch could not be read has 0 examples.
_WIDTH = 3
_SHARD = ("ds.shard(input_context.num_input_pipelines, "
          "input_context.input_pipeline_id) before batching")


def check(strategy, dataset_fn, role: strategies.Role,
          per_replica_pipelines: bool, split: str = "train") -> str:
  """Raises UserError (on every worker together) when two input pipelines
  read the same first batch of `split` of examples that differ; returns
  the line to say when they read the same batch of repeated examples, else
  ''. A collective under multi-worker: every worker calls it at the same
  point (the same config: api.build)."""
  if (role.pipelines < 2 or getattr(dataset_fn, "builtin_data", None) or
      isinstance(strategy, tf.distribute.TPUStrategy)):
    # One pipeline; the built-in data, sharded at its source (data/); a
    # TPU pod, whose hosts have no collective of the host's values here.
    return ""
  replicas = strategy.num_replicas_in_sync
  mine = {}
  with process_state.undrawn(), quiet.startup_lines_filtered(
      noise=_PARTLY_CACHED):
    for ctx in _contexts(strategy, role, per_replica_pipelines):
      with origins.raised_in(f"dataset_fn({split!r}, ...) "
                             f"{imports.name_of(dataset_fn)}"):
        ds = dataset_fn(split, ctx)
      mine[ctx.input_pipeline_id] = first_batch(ds)
  seen = _gathered(strategy, role, mine)
  same = _same(seen)
  if not same:
    return ""
  line = _said(split, same, seen[same[0]], role.pipelines,
               "replica" if per_replica_pipelines else "worker", replicas)
  if seen[same[0]][1] * 2 <= seen[same[0]][2]:
    return line  # Examples repeated within the batch: maybe by design.
  error = UserError(line)
  raise leaving.refused_together(error) if role.workers > 1 else error


def _contexts(strategy, role, per_replica_pipelines: bool) -> list:
  """This process's input contexts, as tf.distribute makes them: every
  replica's here (MirroredStrategy; a multi-worker one refuses a pipeline
  per replica), else this worker's one."""
  replicas = strategy.num_replicas_in_sync
  if per_replica_pipelines:
    return [tf.distribute.InputContext(replicas, i, replicas)
            for i in range(replicas)]
  return [tf.distribute.InputContext(role.workers,
                                     strategies.worker_id(strategy), replicas)]


def first_batch(ds) -> tuple:
  """(digest, examples that differ, examples) of `ds`'s first element;
  (0, 0, 0) where it cannot be read (the run's first step says why)."""
  iterator = iter(ds)
  try:
    batch = next(iterator)
  except (tf.errors.OpError, StopIteration):
    return 0, 0, 0
  finally:
    del iterator  # (Its warnings now, inside the caller's filter.)
  rows = [_rows(part) for part in tf.nest.flatten(batch) if part is not None]
  size = max((len(r) for r in rows if len(r) > 1), default=1)
  examples = [hashlib.blake2b(b"".join(
      r[i if len(r) > 1 else 0] for r in rows), digest_size=8).digest()
              for i in range(size)]
  digest = hashlib.blake2b(b"".join(examples), digest_size=4).digest()
  return int.from_bytes(digest, "big"), len(set(examples)), size


def _rows(part) -> list:
  """Each example's bytes of one part of a batch (one item: a scalar)."""
  if isinstance(part, tf.RaggedTensor):
    return [repr(row).encode() for row in part.to_list()]
  if isinstance(part, tf.SparseTensor):
    part = tf.sparse.to_dense(part)
  values = np.asarray(part)
  if values.ndim == 0:
    return [repr(values.item()).encode()]
  if values.dtype == object:  # Strings: each with its length.
    return [b"".join(len(v).to_bytes(8, "big") + v for v in row.ravel())
            for row in values.reshape(len(values), -1)]
  return [row.tobytes() for row in values.reshape(len(values), -1)]


def _gathered(strategy, role, mine: dict) -> dict:
  """{pipeline id: fingerprint} of every pipeline of the job (`mine`:
  this process's), through one sum into each pipeline's own slot."""
  if role.workers < 2:
    return mine
  slots = np.zeros(role.pipelines * _WIDTH)
  for pipeline, seen in mine.items():
    slots[pipeline * _WIDTH:(pipeline + 1) * _WIDTH] = seen
  # Each of a worker's replicas adds its worker's slots.
  total = allreduce.host_vector_sum(strategy)(slots) / (
      strategy.num_replicas_in_sync // role.workers)
  return {p: tuple(int(v) for v in np.rint(total[p * _WIDTH:(p + 1) * _WIDTH]))
          for p in range(role.pipelines)}


def _same(seen: dict) -> list:
  """The first pipelines (by id) whose first batches are the same batch of
  examples that are not all alike; [] if none."""
  groups = {}
  for pipeline, (digest, differ, _) in sorted(seen.items()):
    if differ > 1:
      groups.setdefault(digest, []).append(pipeline)
  return next((group for group in groups.values() if len(group) > 1), [])


def _said(split: str, same: list, seen: tuple, pipelines: int, per: str,
          replicas: int) -> str:
  """The line for pipelines `same` (ids) reading the same first batch of
  `split` (`seen`: its fingerprint) among `pipelines`, one per `per`."""
  _, differ, size = seen
  names = (", ".join(map(str, same[:-1])) + f" and {same[-1]}"
           f" (of {pipelines}, one per {per})")
  times = f"{len(same)} times over"
  said = f"dataset_fn({split!r}, ...) gives input pipelines {names} the same"
  if differ * 2 <= size:
    return (f"{said} first batch, of {size} examples of which only {differ} "
            "differ: if it repeats examples by design, ignore this; if it "
            "does not shard by input_context, each "
            + (f"step trains on those examples {times}, not on one "
               "device's" if split == "train" else
               f"eval counts its examples {times}")
            + f": shard it, {_SHARD}.")
  if split == "train":
    effect = (f"every step's global batch of {size * replicas} would hold "
              f"the same {size} examples {times}, which one device never "
              "trains on")
  else:
    effect = (f"every eval would count each example {times} (the same "
              "means, eval_examples that many times the split's) and take "
              "as long as one pipeline reading the whole split")
  return (f"{said} first batch ({size} examples): it does not shard by "
          f"input_context, so {effect}; shard it in dataset_fn, {_SHARD} "
          "(dist_keras never auto-shards; Keras' fit does).")
