"""The dataset_fn side of the contract: what its batches must be, and how
they are named in messages ('x float32[32,50], y int32[32]').

dataset_fn(split, input_context) -> that input pipeline's tf.data.Dataset of
per-replica batches (x, y) or (x, y, sample_weight); split is "train"
(repeated; batches of exactly global / replicas examples) or "eval" (finite;
the last batch may be partial). Every check raises UserError with one line
naming the bad value and the fix, before anything is written.
"""
import re

import keras
import tensorflow as tf

from dist_keras.errors import UserError

# A batch value a lookup cannot take, as TensorFlow's CPU kernels say it
# (an Embedding's gather; a sparse cross-entropy's label check).
_BAD_INDEX = re.compile(
    r"indices\[[\d,]+\] = -?\d+ is not in \[0, \d+\)"
    r"|Received a label value of -?\d+ which is outside the valid range of "
    r"\[0, \d+\)")
# tf.data's text when a second iterator writes a cache file another one is
# writing: "... cache lockfile already exists ('PATH.lockfile'). ..."
# (tf.data adds "_<shard>" to the name the dataset gave.)
_CACHE_LOCKED = re.compile(
    r"cache lockfile already exists \('(.*?)(?:_\d+)?\.lockfile'")


def check_dataset(ds, split: str, global_batch_size: int, replicas: int,
                  eval_steps: int = 0, ctx=None) -> None:
  """Raises UserError if `ds` breaks the dataset_fn contract for `split`;
  `ctx`, the tf.distribute.InputContext it was made for (None: the only
  pipeline)."""
  where = f"dataset_fn({split!r}, ...)"
  if not isinstance(ds, tf.data.Dataset):
    raise UserError(
        f"{where} returned a {type(ds).__name__}, not a tf.data.Dataset; "
        "wrap arrays in tf.data.Dataset.from_tensor_slices((x, y)), a "
        "generator or keras.utils.PyDataset in tf.data.Dataset.from_generator"
        "(fn, output_signature=...), then shard and batch it there.")
  pipelines = ctx.num_input_pipelines if ctx else 1
  _check_not_auto_sharded(ds, where, pipelines)
  spec = ds.element_spec
  if isinstance(spec, tuple) and not 1 <= len(spec) <= 3:
    raise UserError(f"{where} yields tuples of {len(spec)} ({describe(spec)});"
                    " yield (x, y) or (x, y, sample_weight) batches.")
  _check_known_rank(where, spec)
  cardinality = int(ds.cardinality())
  if split == "train":
    _check_batch_size(where, spec, global_batch_size, replicas)
    if cardinality == 0:  # repeat() of nothing: batched before repeat().
      raise UserError(smaller_than_a_batch(
          f"{where} ends after 0 batches", global_batch_size // replicas,
          ctx.input_pipeline_id if ctx else 0, pipelines))
    if cardinality > 0:
      raise UserError(f"{where} ends after {cardinality} batches; repeat it "
                      "(ds.repeat()) so training runs train.steps steps.")
  # With several pipelines one may have no eval examples (a small split
  # sharded): its replicas add none; the eval refuses a job that saw none.
  elif cardinality == 0 and pipelines == 1:
    raise UserError(no_eval_examples(f"{where} has no batches"))
  elif cardinality == tf.data.INFINITE_CARDINALITY and not eval_steps:
    raise UserError(f"{where} never ends; make the eval split finite (no "
                    "repeat()), or set eval.steps to evaluate that many "
                    "batches.")


def data_fault(error: Exception) -> UserError | None:
  """The UserError for a runtime error that is the data's fault, not a
  bug (a batch value the model cannot take; a cache file two pipelines
  write), else None: the training loop's errors are read here, once."""
  return _bad_value(error) or _cache_in_use(error)


def _bad_value(error: Exception) -> UserError | None:
  """The UserError for a runtime error that says a batch held an index
  out of its table's range (the data's fault, not a bug), else None."""
  found = _BAD_INDEX.search(str(error))
  if not isinstance(error, tf.errors.InvalidArgumentError) or found is None:
    return None
  return UserError(
      f"a batch holds a value the model cannot take ({found[0]}): a token "
      "id at or above an Embedding's input_dim, or a label at or above the "
      "number of classes; fix the data, or size the model for it (built-in "
      "models: data.vocab_size, data.num_classes).")


def _cache_in_use(error: Exception) -> UserError | None:
  """The UserError for a file `ds.cache(FILENAME)` another input pipeline
  writes (every pipeline of the job on one host, or on one shared disk,
  given the same name), else None. One name per pipeline and pipeline
  count also keeps a later run from reading a file cached for another
  sharding (tf.data reads a whole cache file as it is)."""
  found = _CACHE_LOCKED.search(str(error))
  if not isinstance(error, tf.errors.AlreadyExistsError) or found is None:
    return None
  return UserError(
      f"dataset_fn caches to ds.cache({found[1]!r}), which another input "
      "pipeline is writing (the pipelines' caches share one name); name it "
      "per pipeline: ds.cache(f\"...-{input_context.input_pipeline_id}-of-"
      "{input_context.num_input_pipelines}\"), or cache in memory "
      "(ds.cache()).")


# What else an eval split without examples may mean.
OR_NONE = (", or return None for no eval split (training only, as Keras' "
           "fit without validation_data)")


def no_eval_examples(what: str) -> str:
  """The line for an eval split without examples (in every pipeline)."""
  return (f"{what}; give the eval split examples (built-in data: "
          f"data.eval_size >= 1){OR_NONE}.")


def smaller_than_a_batch(where: str, per_replica: int, pipeline,
                         pipelines: int) -> str:
  """The line for a train stream that gives no batch at all: the split of
  input pipeline `pipeline` (None: not known which) of `pipelines` holds
  fewer examples than one batch, so batch(drop_remainder=True) makes none
  and a repeat() after it repeats nothing."""
  if pipelines == 1:
    whose, fewer = "its train split", ""
  else:
    which = (f"input pipeline {pipeline}'s" if pipeline is not None
             else "an input pipeline's")
    whose, fewer = f"{which} (of {pipelines}) train split", (
        " fewer input pipelines or")
  return (
      f"{where}: {whose} holds fewer examples than one per-replica batch "
      f"of {per_replica} (drop_remainder=True), so no batch comes, repeated "
      "or not; repeat before batching (ds.repeat().batch(...)), or use"
      f"{fewer} a smaller train.global_batch_size.")


def _check_not_auto_sharded(ds, where: str, pipelines: int) -> None:
  """A dataset that asks tf.data to auto-shard it (FILE, DATA, HINT) is
  read whole by every pipeline: distribute_datasets_from_function never
  auto-shards, so each pipeline would train on every example."""
  policy = ds.options().experimental_distribute.auto_shard_policy
  left = (tf.data.experimental.AutoShardPolicy.AUTO,
          tf.data.experimental.AutoShardPolicy.OFF)
  if pipelines > 1 and policy not in left:
    raise UserError(
        f"{where} sets auto_shard_policy={policy.name}, but dist_keras calls "
        f"dataset_fn once per input pipeline ({pipelines} here) and never "
        "auto-shards, so every pipeline would read the whole split; shard "
        "it yourself (ds.shard(input_context.num_input_pipelines, "
        "input_context.input_pipeline_id), or files before reading them) and"
        " leave the policy at AUTO or OFF.")


def _check_known_rank(where: str, spec) -> None:
  """A tf.py_function or numpy_function returns tensors of unknown rank,
  which Keras cannot build or call a model on (fit fails on them too)."""
  unknown = [s for s in _tensors(spec) if s.shape.rank is None]
  if unknown:
    raise UserError(
        f"{where} yields batches of unknown rank ({describe(spec)}), as a "
        "tf.py_function or tf.numpy_function returns them; give them their "
        "shapes after it (t.set_shape([batch, ...]) in the mapped function,"
        " or tf.ensure_shape(t, [batch, ...])), as Keras' fit needs too.")


def _check_batch_size(where: str, spec, global_batch_size: int,
                      replicas: int) -> None:
  """Every replica must get global / replicas examples, in static shapes
  (XLA and TPUs need them; Keras' loss scaling by 1 / replicas assumes
  equal shares)."""
  wanted = global_batch_size // replicas
  parts = _tensors(spec)
  sizes = {s.shape[0] if s.shape.rank else None for s in parts}
  if any(s.shape.rank == 0 for s in parts) or len(sizes - {None}) > 1:
    # Batched, every part would have a first dimension, the same for all.
    raise UserError(
        f"{where} yields elements whose first dimensions differ "
        f"({describe(spec)}): are they batched? batch with "
        f"input_context.get_per_replica_batch_size({global_batch_size}) and "
        "drop_remainder=True.")
  state_it = ("ds.map(lambda *b: tf.nest.map_structure(lambda t: "
              f"tf.ensure_shape(t, [{wanted}, *t.shape[1:]]), b))")
  if sizes == {None, wanted}:  # Batched whole; a map after lost a size.
    raise UserError(
        f"{where} yields batches of unknown size in part ({describe(spec)})"
        f": a function mapped after batch() (TextVectorization does) lost "
        f"the batch dimension of what the others keep at {wanted}; state it"
        f" at the end of the map, or map it again: {state_it}.")
  if None in sizes:
    # drop_remainder=True cannot make every size static: a generator's
    # batches, bucket_by_sequence_length(drop_remainder=True) and a
    # function after batch() keep it unknown; then only the user can say it.
    raise UserError(
        f"{where} yields batches of unknown size ({describe(spec)}), but "
        f"every replica needs exactly {wanted} examples in a static shape; "
        "batch with drop_remainder=True, or where the batches are whole but "
        "their size unknown (bucket_by_sequence_length, a generator of "
        f"batches: its output_signature), state it: {state_it}.")
  if sizes != {wanted}:
    got = min(sizes)
    raise UserError(
        f"{where} yields per-replica batches of {got} examples, but "
        f"train.global_batch_size={global_batch_size} over {replicas} "
        f"replica(s) needs {wanted}; batch with input_context."
        f"get_per_replica_batch_size({global_batch_size}), or set "
        f"train.global_batch_size={got * replicas}.")


def _tensors(spec) -> list:
  """The specs of a batch's tensors: a None in it ((x, None), as Keras'
  fit takes) holds none."""
  return [s for s in tf.nest.flatten(spec)
          if s is not None and not isinstance(s, tf.NoneTensorSpec)]


def check_batched_like(eval_spec, train_spec) -> None:
  """The eval split's x and y must have the train split's structure and
  ranks (its batches may be smaller): an unbatched split loses a rank."""
  for a, b in zip(keras.utils.unpack_x_y_sample_weight(eval_spec)[:2],
                  keras.utils.unpack_x_y_sample_weight(train_spec)[:2]):
    if not _tensors(a) or not _tensors(b):  # Labels: _probe says if needed.
      continue
    try:
      tf.nest.assert_same_structure(a, b)
      same = all(s.shape.rank == t.shape.rank for s, t in
                 zip(tf.nest.flatten(a), tf.nest.flatten(b)))
    except (ValueError, TypeError):
      same = False
    if not same:
      raise UserError(
          f"dataset_fn('eval', ...) yields {describe(eval_spec)}, unlike the "
          f"train split's batches ({describe(train_spec)}); batch the eval "
          "split as the train split (ds.batch(...)), with the same "
          "structure.")


def describe(spec) -> str:
  """'x float32[32,50], y int32[32]' for an element spec."""
  parts = spec if isinstance(spec, tuple) else (spec,)
  names = ("x", "y", "sample_weight") if len(parts) <= 3 else [
      f"[{i}]" for i in range(len(parts))]
  return ", ".join(f"{name} {_spec_text(part)}"
                   for name, part in zip(names, parts))


def _spec_text(spec) -> str:
  """'float32[32,?]', '{ids: int32[32,50], mask: bool[32,50]}', '(...)'."""
  if isinstance(spec, dict):
    return "{" + ", ".join(f"{k}: {_spec_text(v)}"
                           for k, v in spec.items()) + "}"
  if isinstance(spec, (tuple, list)):
    return "(" + ", ".join(_spec_text(s) for s in spec) + ")"
  if isinstance(spec, tf.NoneTensorSpec):
    return "None"
  if spec.shape.rank is None:
    return f"{spec.dtype.name}[unknown rank]"
  return f"{spec.dtype.name}{list(spec.shape)}".replace(" ", "").replace(
      "None", "?")


def zeros(spec):
  """A batch of one example shaped like `spec` (unknown sizes: 1)."""

  def zero(s):
    if isinstance(s, tf.NoneTensorSpec):
      return None
    shape = [1] + [d if d is not None else 1 for d in s.shape[1:]]
    if isinstance(s, tf.RaggedTensorSpec):
      return tf.RaggedTensor.from_tensor(tf.zeros(shape, s.dtype))
    if s.dtype == tf.string:
      return tf.fill(shape, "")
    return tf.zeros(shape, s.dtype)

  return tf.nest.map_structure(zero, spec)
