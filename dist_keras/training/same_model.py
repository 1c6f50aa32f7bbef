"""Workers whose model_fn built different models, refused before they train.

Every worker of a cluster calls model_fn itself. Models of different
weights' shapes fail as their variables are made (a collective's "Shape
mismatch": said in one line, `shapes_said`); models of the same shapes that
compute, or are trained,
differently (an activation, a loss, a learning rate of the worker's own)
trained on silently: their gradients were averaged over two functions, and
the chief's eval and model.keras were of neither (2026-12-06: tanh on one
worker, relu on the other, 200 steps, exit 0). So, right after model_fn,
the workers compare what defines the training, by part (`fingerprint`):
one 32-bit digest of each part, gathered through one small collective (a
sum into each worker's own slot). Only where they differ do they gather
more: the first differing worker's and worker 0's text of that part, to
name its first differing key. Every worker sees the same digests, so all
refuse together, with the same line.

Auto-generated names do not count (a script that built another model
first names its layers dense_1, ...): every layer's name is replaced by
its place in the config. Nor do the layers' seeds: the strategy sends
worker 0's initial values to every worker, and a dropout's draws may
differ. A subclassed model without a config of its own
counts by its class and its weights' shapes.
"""
import contextlib
import hashlib
import json
import re

import numpy as np
import tensorflow as tf

from dist_keras.distribute import leaving
from dist_keras.errors import UserError
from dist_keras.training import allreduce

# The most text gathered to name a differing key (bytes over all parts and
# workers, a float64 each in the collective); past it, the part alone.
_MAX_DETAIL_BYTES = 4 << 20
# compile()'s arguments that change how Keras runs a step, not what it
# computes (dist_keras runs its own loop), and the optimizer's own part.
_NOT_COMPILED = ("optimizer", "run_eagerly", "steps_per_execution",
                 "jit_compile", "auto_scale_loss")


_FIX = ("build and compile the same model on every worker (the same code "
        "and values): its gradients are averaged over the workers, which "
        "trains no one model.")
# What a collective says as model_fn makes a variable of another shape
# than another worker's (MultiWorkerMirroredStrategy sends each initial
# value from worker 0 as it is made; TF 2.21).
_SHAPES = re.compile(
    r"Shape mismatch in the collective instance \d+\. Op at device "
    r"/job:(\w+)/replica:\d+/task:(\d+)/\S+ expected shape (\[[\d,]*\]) "
    r"but another member in the group expected shape (\[[\d,]*\])")


@contextlib.contextmanager
def shapes_said():
  """Around model_fn's call: weights of other shapes than another
  worker's fail as they are made (a collective's shape mismatch, exit 1 on
  one or both, or a lost peer, exit 200), refused here in one line."""
  try:
    yield
  except tf.errors.InvalidArgumentError as e:
    found = _SHAPES.search(str(e))
    if found is None:
      raise
    kind, task, mine, other = found.groups()
    raise UserError(
        f"the workers' model_fn built weights of different shapes ({mine} "
        f"on {kind}:{task}, {other} on another worker); {_FIX}") from e


def fingerprint(model) -> dict:
  """{part: plain JSON value}: what defines `model`'s training, names
  aside (Keras numbers a metric's or a layer's auto name per process)."""
  compiled = _config(model.get_compile_config) or {}
  architecture = _config(model.get_config)
  optimizer = _config(model.optimizer.get_config) if model.optimizer else None
  return {
      "architecture": {
          "class": f"{type(model).__module__}.{type(model).__qualname__}",
          **_unnamed(architecture if isinstance(architecture, dict) else {},
                     _layer_names(model), {})},
      "weights' shapes": [[list(w.shape), str(w.dtype), w.trainable]
                          for w in model.weights],
      "loss and metrics": _nameless({k: v for k, v in compiled.items()
                                     if k not in _NOT_COMPILED}),
      "optimizer": {"class": type(model.optimizer).__name__,
                    **_nameless(optimizer if isinstance(optimizer, dict)
                                else {})}}


def refuse_different(strategy, model) -> None:
  """Raises UserError on every worker of a cluster (together) when their
  models' fingerprints differ, naming the parts and a differing key."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return  # One process: one model.
  parts = {part: _plain(value) for part, value in fingerprint(model).items()}
  texts = {part: json.dumps(value, sort_keys=True)
           for part, value in parts.items()}
  digests = [_digest(text) for text in texts.values()]
  gather = _Gather(strategy)
  table = gather(digests)  # [worker][part]
  odd = {part: next((w for w in range(len(table))
                     if table[w][i] != table[0][i]), None)
         for i, part in enumerate(parts)}
  odd = {part: w for part, w in odd.items() if w is not None}
  if not odd:
    return
  details = _differences(gather, parts, odd)
  raise leaving.refused_together(UserError(
      f"the workers' model_fn built different models: {'; '.join(details)};"
      f" {_FIX}"))


class _Gather:
  """`(values) -> [[values] of each worker]`: every worker's list of the
  same length, through one collective sum into its own slot."""

  def __init__(self, strategy):
    self.total = allreduce.host_vector_sum(strategy)
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    self.names = [f"{kind}:{i}" for kind in ("chief", "worker")
                  for i in range(len(cluster.get(kind, ())))]
    # This worker's slot: its place among the names (chief first).
    self.me = self.names.index(
        f"{resolver.task_type}:{int(resolver.task_id or 0)}")
    # Each of a worker's replicas adds its value.
    self.replicas = strategy.num_replicas_in_sync // len(self.names)

  def __call__(self, values) -> list:
    width = len(values)
    slots = np.zeros(width * len(self.names))
    slots[self.me * width:(self.me + 1) * width] = values
    return self.sum(slots).astype(np.int64).reshape(
        len(self.names), width).tolist()

  def sum(self, slots):
    """The workers' sum of `slots` (each worker's once)."""
    return np.rint(self.total(slots) / self.replicas)


def _differences(gather: _Gather, parts: dict, odd: dict) -> list:
  """'the PART differs between worker:0 and worker:N (KEY: A against B)'
  for each part in `odd` ({part: the first worker whose part differs from
  worker 0's}); the key named where the texts are small enough."""
  texts = {part: json.dumps(parts[part]).encode() for part in odd}
  lengths = gather([len(texts[part]) if gather.me in (0, w) else 0
                    for part, w in odd.items()])
  sizes = [(lengths[0][i], lengths[w][i]) for i, w in enumerate(odd.values())]
  starts = np.cumsum([0] + [a + b for a, b in sizes])
  # (Every worker decides alike: they saw the same lengths.)
  read = starts[-1] <= _MAX_DETAIL_BYTES
  if read:
    slots = np.zeros(starts[-1])
    for (part, w), start, (first, _) in zip(odd.items(), starts, sizes):
      if gather.me in (0, w):  # Worker 0's text first, then worker w's.
        at = start + (first if gather.me else 0)
        slots[at:at + len(texts[part])] = np.frombuffer(texts[part], np.uint8)
    text = bytes(gather.sum(slots).astype(np.uint8))
  said = []
  for (part, w), start, (first, other) in zip(odd.items(), starts, sizes):
    found = read and _first_difference(
        json.loads(text[start:start + first]),
        json.loads(text[start + first:start + first + other]))
    said.append(f"the {part} differs between {gather.names[0]} and "
                f"{gather.names[w]}" + (f" ({_said(found)})" if found else ""))
  return said


def _first_difference(a, b, path: str = ""):
  """(path, a's value, b's value) of the first place JSON values `a` and
  `b` differ, else None."""
  if isinstance(a, dict) and isinstance(b, dict):
    for key in [*a, *(k for k in b if k not in a)]:
      here = f"{path}.{key}" if path else key
      if key not in a or key not in b:
        return here, a.get(key, "(none)"), b.get(key, "(none)")
      found = _first_difference(a[key], b[key], here)
      if found:
        return found
    return None
  if isinstance(a, list) and isinstance(b, list):
    for i, (x, y) in enumerate(zip(a, b)):
      found = _first_difference(x, y, f"{path}[{i}]")
      if found:
        return found
    if len(a) != len(b):
      return f"{path or 'the list'}'s length", len(a), len(b)
    return None
  return None if a == b else (path or "the value", a, b)


def _said(found) -> str:
  path, a, b = found
  return f"{path}: {_clip(a)} against {_clip(b)}"


def _clip(value, limit: int = 60) -> str:
  text = f"{value:.7g}" if isinstance(value, float) else json.dumps(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _digest(text: str) -> int:
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4)
                        .digest(), "big")


def _config(get):
  """get(), else None (a subclass that cannot give its config)."""
  try:
    return get()
  except Exception:  # pylint: disable=broad-except
    return None


def _plain(value):
  """`value` as JSON's types: what json cannot say is its type's name (a
  repr could hold an address, which differs between processes)."""
  return json.loads(json.dumps(value, default=lambda o: (
      o.tolist() if isinstance(o, (np.ndarray, np.generic))
      else f"<{type(o).__module__}.{type(o).__qualname__}>")))


def _layer_names(model) -> set:
  """The names of `model` and of its layers, nested models' too."""
  names, todo = set(), [model]
  while todo:
    layer = todo.pop()
    names.add(layer.name)
    todo += getattr(layer, "layers", None) or []
  return names


def _unnamed(value, names: set, seen: dict, key=None):
  """`value` (a config) with each of `names` where a config names a layer
  (a "name", a [layer, node, tensor] reference) replaced by its order of
  first appearance (`seen`), and without its seeds."""
  if isinstance(value, dict):
    return {k: _unnamed(v, names, seen, k) for k, v in value.items()
            if k != "seed"}
  if isinstance(value, (list, tuple)):
    if (len(value) == 3 and isinstance(value[0], str) and value[0] in names
        and all(isinstance(i, int) for i in value[1:])):
      return [_placeholder(value[0], seen), *value[1:]]
    return [_unnamed(v, names, seen) for v in value]
  if key == "name" and isinstance(value, str) and value in names:
    return _placeholder(value, seen)
  return value


def _nameless(value):
  """`value` (a config) without its "name" keys."""
  if isinstance(value, dict):
    return {k: _nameless(v) for k, v in value.items() if k != "name"}
  if isinstance(value, (list, tuple)):
    return [_nameless(v) for v in value]
  return value


def _placeholder(name: str, seen: dict) -> str:
  return seen.setdefault(name, f"<layer {len(seen)}>")
