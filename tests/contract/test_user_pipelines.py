"""A user's own data over several input pipelines: what one pipeline alone
may lack, what the job as a whole must have, and the arguments of fit that
are not functions. Two pipelines in one process (MirroredStrategy over 2
CPUs with data.pipeline_per_replica) stand for 2 workers, each reading the
shard its dataset_fn picks by input_context.input_pipeline_id; and Keras'
fit arguments given to dist_keras.fit."""
import inspect
import re
import types

import numpy as np
import pytest
import tensorflow as tf
import user_task
from dist_keras.configs import base

import dist_keras
from dist_keras import origins
from dist_keras.contract import batches, fit_args
from dist_keras.distribute import strategies
from dist_keras.errors import UserError
from dist_keras.training import unsharded

CONFIG = {"train.global_batch_size": user_task.GLOBAL_BATCH,
          "train.steps": 4, "train.log_every": 4, "eval.every": 0,
          "log.calibration_steps": 0, "log.progress": False,
          "data.pipeline_per_replica": True}
PER_REPLICA = user_task.GLOBAL_BATCH // 2


def _fit(tmp_path, dataset_fn, mirrored, **config):
  return dist_keras.fit(user_task.model_fn, dataset_fn,
                        workdir=str(tmp_path / "run"),
                        config=dict(CONFIG, **config), strategy=mirrored)


def _eval_of(n: int, filtered: bool = False):
  """user_task's data with an eval split of its first `n` examples, sharded
  by pipeline (`filtered`: of a size unknown until it is read)."""

  def dataset_fn(split, ctx):
    if split == "train":
      return user_task.dataset_fn(split, ctx)
    x, y, weights = (a[:n] for a in user_task._examples("eval"))  # pylint: disable=protected-access
    ds = tf.data.Dataset.from_tensor_slices((x, y, weights))
    if filtered:
      ds = ds.filter(lambda *_: True)
    return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(
        ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH))

  return dataset_fn


def _auto_sharded(policy):
  """user_task's data, unsharded, asking tf.data to auto-shard it."""

  def dataset_fn(split, ctx):
    x, y, weights = user_task._examples(split)  # pylint: disable=protected-access
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    ds = tf.data.Dataset.from_tensor_slices((x, y, weights)).with_options(
        options)
    batch = ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH)
    return (ds.repeat().batch(batch, drop_remainder=True) if split == "train"
            else ds.batch(batch))

  return dataset_fn


@pytest.mark.parametrize("policy", ["FILE", "DATA", "HINT"])
def test_an_auto_shard_policy_is_refused_over_several_pipelines(
    tmp_path, mirrored, policy):
  """Every pipeline would read the whole split (each example twice an
  epoch, the eval counted twice): dist_keras never auto-shards."""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _auto_sharded(
        getattr(tf.data.experimental.AutoShardPolicy, policy)), mirrored)
  assert str(e.value) == (
      f"dataset_fn('train', ...) sets auto_shard_policy={policy}, but "
      "dist_keras calls dataset_fn once per input pipeline (2 here) and "
      "never auto-shards, so every pipeline would read the whole split; "
      "shard it yourself (ds.shard(input_context.num_input_pipelines, "
      "input_context.input_pipeline_id), or files before reading them) and "
      "leave the policy at AUTO or OFF.")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("policy", ["FILE", "DATA", "HINT", "AUTO", "OFF"])
def test_any_auto_shard_policy_is_fine_for_one_pipeline(policy):
  """One pipeline reads the whole split anyway (and AUTO or OFF, the
  defaults, are fine for any number)."""
  ds = _auto_sharded(getattr(tf.data.experimental.AutoShardPolicy, policy))(
      "train", tf.distribute.InputContext(1, 0, 2))
  batches.check_dataset(ds, "train", user_task.GLOBAL_BATCH, 2,
                        ctx=tf.distribute.InputContext(1, 0, 2))
  if policy in ("AUTO", "OFF"):
    batches.check_dataset(ds, "train", user_task.GLOBAL_BATCH, 2,
                          ctx=tf.distribute.InputContext(2, 1, 2))


def test_a_dataset_fn_that_does_not_shard_is_refused_before_a_step(
    tmp_path, mirrored):
  """Keras' fit shards for its user; dist_keras never does. Every pipeline
  read the same stream: each step's global batch was the first 24
  examples twice, trained silently (20 steps: 0.043 off one device).
  Refused in one line, nothing written."""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, user_task.unsharded_dataset_fn, mirrored)
  assert str(e.value) == (
      "dataset_fn('train', ...) gives input pipelines 0 and 1 (of 2, one "
      f"per replica) the same first batch ({PER_REPLICA} examples): it does "
      "not shard by input_context, so every step's global batch of "
      f"{user_task.GLOBAL_BATCH} would hold the same {PER_REPLICA} examples"
      " 2 times over, which one device never trains on; shard it in "
      "dataset_fn, ds.shard(input_context.num_input_pipelines, "
      "input_context.input_pipeline_id) before batching (dist_keras never "
      "auto-shards; Keras' fit does).")
  assert not (tmp_path / "run").exists()


def _eval_unsharded(split, ctx):
  """user_task's train split sharded, its eval split not."""
  if split == "train":
    return user_task.dataset_fn(split, ctx)
  return user_task.unsharded_dataset_fn(split, ctx)


def test_an_eval_split_that_does_not_shard_is_refused_before_a_step(
    tmp_path, mirrored):
  """Each pipeline would evaluate the whole split: the same means, every
  example counted twice (eval_examples 2x the split's), no faster than
  one pipeline. Refused in one line, nothing written."""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _eval_unsharded, mirrored)
  assert str(e.value) == (
      "dataset_fn('eval', ...) gives input pipelines 0 and 1 (of 2, one per "
      f"replica) the same first batch ({PER_REPLICA} examples): it does not "
      "shard by input_context, so every eval would count each example 2 "
      "times over (the same means, eval_examples that many times the "
      "split's) and take as long as one pipeline reading the whole split; "
      "shard it in dataset_fn, ds.shard(input_context.num_input_pipelines, "
      "input_context.input_pipeline_id) before batching (dist_keras never "
      "auto-shards; Keras' fit does).")
  assert not (tmp_path / "run").exists()


def _alike(split, ctx):
  """Unsharded batches of one example (zeros) over and over, as tests and
  users write them: pipelines that read them alike train alike."""
  ds = tf.data.Dataset.from_tensors((tf.zeros([user_task.FEATURES]),
                                     tf.ones([1])))
  ds = ds.repeat() if split == "train" else ds.repeat(5)
  return ds.batch(ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH),
                  drop_remainder=split == "train")


def _in_pairs(split, ctx):
  """user_task's data, unsharded, each example twice in a row: equal
  first batches whose examples repeat say nothing certain."""
  ds = user_task.unsharded_dataset_fn(split, ctx).unbatch()
  ds = ds.flat_map(lambda *e: tf.data.Dataset.from_tensors(e).repeat(2))
  return ds.batch(ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH),
                  drop_remainder=True)


def test_first_batches_alike_or_of_repeated_examples_are_not_refused(
    tmp_path, mirrored):
  """A constant dataset trains; a sharded one says nothing; pipelines
  whose first batches repeat examples within themselves are told the fix
  in a line, not refused."""
  role = strategies.Role.of(mirrored, True)
  assert unsharded.check(mirrored, user_task.dataset_fn, role, True) == ""
  assert unsharded.check(mirrored, _in_pairs, role, True) == (
      "dataset_fn('train', ...) gives input pipelines 0 and 1 (of 2, one "
      f"per replica) the same first batch, of {PER_REPLICA} examples of "
      f"which only {PER_REPLICA // 2} differ: if it repeats examples by "
      "design, ignore this; if it does not shard by input_context, each "
      "step trains on those examples 2 times over, not on one device's: "
      "shard it, ds.shard(input_context.num_input_pipelines, "
      "input_context.input_pipeline_id) before batching.")
  assert unsharded.check(mirrored, _in_pairs, role, True, "eval") == (
      "dataset_fn('eval', ...) gives input pipelines 0 and 1 (of 2, one "
      f"per replica) the same first batch, of {PER_REPLICA} examples of "
      f"which only {PER_REPLICA // 2} differ: if it repeats examples by "
      "design, ignore this; if it does not shard by input_context, each "
      "eval counts its examples 2 times over: shard it, "
      "ds.shard(input_context.num_input_pipelines, "
      "input_context.input_pipeline_id) before batching.")
  assert _fit(tmp_path, _alike, mirrored).summary["steps"] == CONFIG[
      "train.steps"]


def test_an_eval_split_empty_in_one_pipeline_evaluates_the_rest(
    tmp_path, mirrored):
  """An eval split of 1 example: pipeline 1's shard is empty (its
  replica adds no examples), the job's eval is that one example."""
  result = _fit(tmp_path, _eval_of(1), mirrored)
  assert result.summary["eval_examples"] == 1


def test_an_eval_split_empty_in_every_pipeline_is_refused(tmp_path,
                                                          mirrored):
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _eval_of(0), mirrored)
  assert str(e.value) == (
      "dataset_fn('eval', ...) has no batches in any of its 2 input "
      "pipelines; give the eval split examples (built-in data: "
      "data.eval_size >= 1), or return None for no eval split (training "
      "only, as Keras' fit without validation_data).")
  assert not (tmp_path / "run").exists()


def test_an_eval_split_found_empty_in_every_pipeline_stops_the_run(
    tmp_path, mirrored):
  """Of unknown size (as a worker sees its peers'): the eval counts the
  examples over every replica and refuses a job that saw none."""
  with pytest.raises(UserError, match=(
      r"^dataset_fn\('eval', ...\) gave no examples \(every replica's "
      r"batches were empty\): give the eval split examples")):
    _fit(tmp_path, _eval_of(0, filtered=True), mirrored)
  assert not (tmp_path / "run" / "summary.json").exists()


def _cached_in(path, per_pipeline: bool):
  """user_task's data, sharded, cached to a file under `path`: one name
  for every pipeline, or (`per_pipeline`) a name for each."""

  def dataset_fn(split, ctx):
    name = f"{path}/{split}"
    if per_pipeline:
      name += f"-{ctx.input_pipeline_id}-of-{ctx.num_input_pipelines}"
    ds = tf.data.Dataset.from_tensor_slices(user_task._examples(split))  # pylint: disable=protected-access
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).cache(name)
    batch = ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH)
    return (ds.repeat().batch(batch, drop_remainder=True) if split == "train"
            else ds.batch(batch))

  return dataset_fn


def test_a_cache_file_two_pipelines_write_is_one_line(tmp_path, mirrored):
  """tf.data refuses a second writer of a cache file (AlreadyExistsError,
  said as unexpected, the workdir left behind): the fix is a name per
  pipeline. (The train or the eval split's file: whichever pipeline's
  second writer comes first, which varies between runs.)"""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _cached_in(tmp_path, per_pipeline=False), mirrored)
  split = "eval" if f"{tmp_path / 'eval'}'" in str(e.value) else "train"
  assert str(e.value) == (
      f"dataset_fn caches to ds.cache({str(tmp_path / split)!r}), which "
      "another input pipeline is writing (the pipelines' caches share one "
      "name); name it per pipeline: ds.cache(f\"...-"
      "{input_context.input_pipeline_id}-of-"
      "{input_context.num_input_pipelines}\"), or cache in memory "
      "(ds.cache()).")
  assert not (tmp_path / "run").exists()
  result = _fit(tmp_path, _cached_in(tmp_path, per_pipeline=True), mirrored)
  assert result.summary["eval_examples"] == len(user_task._examples("eval")[0])  # pylint: disable=protected-access


def _small_train(filtered: bool):
  """A train split of 5 examples, sharded (3 and 2), batched before
  repeat(): no pipeline makes a batch of 24 (`filtered`: of a size
  unknown until it is read)."""

  def dataset_fn(split, ctx):
    if split == "eval":
      return user_task.dataset_fn(split, ctx)
    x, y, weights = (a[:5] for a in user_task._examples("train"))  # pylint: disable=protected-access
    ds = tf.data.Dataset.from_tensor_slices((x, y, weights))
    if filtered:
      ds = ds.filter(lambda *_: True)
    return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(
        PER_REPLICA, drop_remainder=True).repeat()

  return dataset_fn


FEWER = (f"holds fewer examples than one per-replica batch of {PER_REPLICA}"
         " (drop_remainder=True), so no batch comes, repeated or not; repeat"
         " before batching (ds.repeat().batch(...)), or use")


@pytest.mark.parametrize("per_replica", [True, False])
def test_a_train_split_smaller_than_a_batch_says_so(tmp_path, mirrored,
                                                    per_replica):
  """Not 'repeat it': it is repeated."""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _small_train(False), mirrored,
         **{"data.pipeline_per_replica": per_replica})
  whose = ("input pipeline 0's (of 2) train split " if per_replica
           else "its train split ")
  fix = " fewer input pipelines or" if per_replica else ""
  assert str(e.value) == (
      f"dataset_fn('train', ...) ends after 0 batches: {whose}{FEWER}{fix} "
      "a smaller train.global_batch_size.")
  assert not (tmp_path / "run").exists()


def test_a_train_stream_without_a_first_batch_says_why(tmp_path, mirrored):
  """Its size unknown until read: found at step 1."""
  with pytest.raises(UserError) as e:
    _fit(tmp_path, _small_train(True), mirrored)
  assert str(e.value) == (
      "dataset_fn('train', ...) ran out of batches at step 1, the first of "
      f"this run: an input pipeline's (of 2) train split {FEWER} fewer input"
      " pipelines or a smaller train.global_batch_size.")


def test_one_pipelines_train_stream_of_padded_batches_running_dry_says_so(
    tmp_path, mirrored):
  """Pipeline 0's stream of padded batches (x int32[24, None]) ends after
  2 batches, its size unknown: step 3 says so. TensorFlow's partial-batch
  handling, on for such a stream, gave replica 0 an empty batch there and
  the step failed (InvalidArgumentError, 'unexpected')."""
  def dataset_fn(split, ctx):
    ds = user_task.padded_dataset_fn(split, ctx)
    if split == "train" and ctx.input_pipeline_id == 0:
      return ds.take(2).filter(lambda *_: True)
    return ds

  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.padded_model_fn, dataset_fn,
                   workdir=str(tmp_path / "run"),
                   config=dict(CONFIG, **{"train.steps": 6,
                                          "train.log_every": 1}),
                   strategy=mirrored)
  assert str(e.value) == (
      "dataset_fn('train', ...) ran out of batches at step 3; repeat it "
      "(ds.repeat()) so training runs train.steps=6 steps.")


def _failing_at_batch(n: int):
  """user_task's data whose map fails its own check at pipeline 1's batch
  `n` (a record the user's pipeline cannot take, met mid-run)."""

  def dataset_fn(split, ctx):
    if split == "eval":
      return None
    x, y, weights = user_task._examples(split)  # pylint: disable=protected-access
    bad = n * PER_REPLICA if ctx.input_pipeline_id == 1 else -1

    def check(i, example):
      x, *rest = example
      x = tf.debugging.check_numerics(
          tf.where(i == bad, np.inf, x), "a bad record")
      return (x, *rest)

    ds = tf.data.Dataset.from_tensor_slices((x, y, weights)).repeat()
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.enumerate().map(check).batch(PER_REPLICA, drop_remainder=True)

  return dataset_fn


def test_a_record_the_pipeline_fails_on_mid_run_is_the_users_data(
    tmp_path, mirrored):
  """fit raises TF's error as it came; the command line's line says it
  came from the input pipeline, not that it was unexpected."""
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    _fit(tmp_path, _failing_at_batch(2), mirrored)
  assert origins.in_users_code(raised.value)
  assert origins.unexpected(raised.value) == (
      "InvalidArgumentError: a bad record : Tensor had Inf values "
      f"({origins.IN_PIPELINE})")


def test_a_built_model_passed_as_model_fn_is_one_line(tmp_path, mirrored):
  """Keras' fit(model, data) habit."""
  model = user_task.model_fn()
  with pytest.raises(UserError) as e:
    dist_keras.fit(model, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), config=CONFIG,
                   strategy=mirrored)
  assert str(e.value) == (
      f"model_fn is a keras.Model ({model.name!r}), not a function that "
      "builds it; pass a function that builds and compiles the model (def "
      "model_fn(): ...): dist_keras calls it inside the strategy's scope, "
      "so its variables are mirrored.")
  assert not (tmp_path / "run").exists()


def test_a_built_model_is_refused_before_the_devices_are_asked_for(tmp_path):
  """Building the model started TensorFlow with its own devices: naming
  them ('TensorFlow already started with 1 logical CPU device(s) ... start a
  new process') sent the user to a new process that failed alike."""
  model = user_task.model_fn()
  with pytest.raises(UserError, match=r"^model_fn is a keras.Model \("):
    dist_keras.fit(model, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"),
                   config=dict(CONFIG, **{"runtime.strategy": "mirrored",
                                          "runtime.num_cpu_devices": 7}))
  assert not (tmp_path / "run").exists()


def test_keras_fits_positional_x_and_y_name_dataset_fn(tmp_path):
  """fit(model_fn, x, y): not Python's 'takes 2 positional arguments'."""
  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.model_fn, np.zeros((4, 6)), np.zeros((4, 1)),
                   workdir=str(tmp_path / "run"))
  assert str(e.value) == (
      "dist_keras.fit takes 2 positional arguments (model_fn, dataset_fn), "
      "not 3; x and y come from dataset_fn, a function of (split, "
      "input_context) returning that split's tf.data.Dataset of (x, y) "
      "batches; see help(dist_keras.fit).")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("data,kind", [
    (tf.data.Dataset.range(3).batch(2), "tf.data.Dataset (_BatchDataset)"),
    ((1, 2), "tuple")])
def test_data_passed_as_dataset_fn_names_the_argument(tmp_path, data, kind):
  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.model_fn, data, workdir=str(tmp_path / "run"),
                   config=CONFIG)
  assert str(e.value) == (
      f"dataset_fn is a {kind}, not a function or a name; pass a function "
      "of (split, input_context) that returns that split's tf.data.Dataset "
      "for that input pipeline (wrap your dataset in one: dist_keras calls "
      "it once per input pipeline); see help(dist_keras.fit).")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(fit_args.KERAS_FIT_ARGS))
def test_a_keras_fit_argument_names_what_does_its_work(tmp_path, name):
  """Not Python's bare TypeError; nothing written."""
  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), **{name: 1})
  assert str(e.value) == (
      f"dist_keras.fit takes no {name}= (Keras' fit does); use "
      f"{fit_args.KERAS_FIT_ARGS[name]}; see help(dist_keras.fit).")
  assert not (tmp_path / "run").exists()
  # The config keys it names are real ones.
  defaults = base.get_config()
  for key in re.findall(r"'(\w+\.\w+)'", fit_args.KERAS_FIT_ARGS[name]):
    section, field = key.split(".")
    assert field in defaults[section], key


def test_any_other_keyword_is_pythons_type_error(tmp_path):
  with pytest.raises(TypeError, match=(
      r"^fit\(\) got an unexpected keyword argument 'epoch'$")):
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), epoch=3)


def test_a_worker_reads_the_input_pipeline_tf_distribute_gives_it():
  """strategies.worker_id: the number run_dry_error names, as
  tf.distribute numbers a worker's pipeline (the chief, if any, first)."""
  def strategy(jobs, task_type, task_id):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs), task_type=task_type, task_id=task_id)
    return types.SimpleNamespace(cluster_resolver=resolver)

  workers = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
  assert strategies.worker_id(strategy(workers, "worker", 1)) == 1
  with_chief = dict(workers, chief=["127.0.0.1:3"])
  assert strategies.worker_id(strategy(with_chief, "chief", 0)) == 0
  assert strategies.worker_id(strategy(with_chief, "worker", 1)) == 2
  assert strategies.worker_id(types.SimpleNamespace(
      cluster_resolver=None)) == 0


def test_fits_signature_and_help_are_its_own():
  """The refusal of Keras' arguments wraps fit without hiding them; the
  class_weight= it takes for fit is shown too (an IDE offers it)."""
  assert list(inspect.signature(dist_keras.fit).parameters) == [
      "model_fn", "dataset_fn", "workdir", "config", "strategy", "callbacks",
      "class_weight"]
  assert inspect.signature(dist_keras.fit).parameters[
      "class_weight"].kind == inspect.Parameter.KEYWORD_ONLY
  assert dist_keras.fit.__doc__.startswith("Trains `model_fn`'s model")


@pytest.mark.parametrize("key,value,what", [
    ("model.name", "cnn", "model_fn"),
    ("data.name", "synthetic", "dataset_fn")])
def test_a_name_in_fits_config_beside_its_function_is_refused(
    tmp_path, key, value, what):
  """config={'model.name': 'cnn'} beside model_fn trained model_fn's model
  and recorded its name over the key, silently."""
  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"),
                   config=dict(CONFIG, **{key: value}))
  fn = getattr(user_task, what)
  passed = f"{fn.__module__}:{fn.__qualname__}"
  assert str(e.value) == (
      f"config[{key!r}]={value!r} and {what}={passed!r} both say what to "
      f"train; drop {key} from config (the {what} argument trains), or pass "
      f"{what}={value!r}.")
  assert not (tmp_path / "run").exists()


def test_a_name_in_fits_config_that_names_its_function_trains(tmp_path):
  """The same function named twice is one choice, not two."""
  name = f"{user_task.__name__}:model_fn"
  result = dist_keras.fit(
      user_task.model_fn, user_task.dataset_fn, workdir=str(tmp_path / "run"),
      config=dict(CONFIG, **{"model.name": name, "train.steps": 1,
                             "log.calibration_steps": 0}),
      strategy="one_device")
  assert result.summary["steps"] == 1
