"""Users' own compiled Keras models and tf.data input (tests/user_task.py),
through `dist_keras.fit` and the command line's import paths."""
import json
import os
import re
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
import user_task
from dist_keras import configs
from dist_keras.contract import batches
from dist_keras.errors import UserError
from dist_keras.training import model_checks

TESTS = helpers.TESTS
CONFIG = {"train.global_batch_size": user_task.GLOBAL_BATCH,
          "train.steps": 12, "train.log_every": 4, "train.checkpoint_every": 4,
          "eval.every": 6, "log.calibration_steps": 0,
          "log.peak_tflops": 1.0, "log.progress": False}
SYNC_TAGS = {"sync/input_wait_ms", "sync/compute_ms", "sync/allreduce_ms",
             "sync/straggler_ms", "sync/fraction"}
TASKS = {  # model_fn, dataset_fn, its compiled metrics
    "regression": ("model_fn", "dataset_fn", ["mae"]),
    "binary": ("binary_model_fn", "binary_dataset_fn", ["accuracy", "auc"]),
    "onehot": ("onehot_model_fn", "onehot_dataset_fn", ["accuracy"]),
    # Weights created on the first call (dist_keras builds it in scope).
    "subclassed": ("subclassed_model_fn", "dataset_fn", ["mae"]),
}


def _fns(task):
  model_name, data_name, _ = TASKS[task]
  return getattr(user_task, model_name), getattr(user_task, data_name)


def _check_outputs(workdir, summary, metrics):
  """summary.json and TensorBoard carry every compiled metric, the loss and
  the sync breakdown."""
  on_disk = json.loads((workdir / "summary.json").read_text())
  assert on_disk == json.loads(json.dumps(summary))
  for name in ["loss", *metrics]:
    assert np.isfinite(summary[f"train_{name}"]), name
    assert np.isfinite(summary[f"eval_{name}"]), name
  assert summary["eval_examples"] == user_task.SIZES["eval"]
  tags = set(helpers.scalar_tags(str(workdir)))
  expected = {"loss", *metrics, *(f"eval/{m}" for m in ["loss", *metrics])}
  assert expected | SYNC_TAGS <= tags, (expected | SYNC_TAGS) - tags
  assert os.path.exists(workdir / "model.keras")


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory, mirrored):
  """The regression task's run at 2 replicas on CONFIG: the Python API's
  and the eval's tests read the same run (~6 CPU-s a run)."""
  workdir = tmp_path_factory.mktemp("regression")
  return workdir, dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                                 workdir=str(workdir), config=CONFIG,
                                 strategy=mirrored)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_users_model_trains_through_the_python_api(tmp_path, mirrored,
                                                     task, request):
  if task == "regression":
    tmp_path, result = request.getfixturevalue("regression_run")
  else:
    model_fn, dataset_fn = _fns(task)
    result = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path),
                            config=CONFIG, strategy=mirrored)
  assert result.summary["steps"] == 12 and result.summary["replicas"] == 2
  _check_outputs(tmp_path, result.summary, TASKS[task][2])
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["model"]["name"] == f"user_task:{TASKS[task][0]}"


@pytest.mark.parametrize("devices", [2, 1])
def test_eval_is_what_keras_computes_on_the_whole_split(tmp_path, mirrored,
                                                       devices, request):
  """The loss (with sample weights and the L2 terms) and the metric over
  the 123 eval examples, aggregated over the replicas' partial batches (or,
  on one device, over the dataset's own batches), equal Keras' own loss and
  metric on the whole split at once. (Keras weights `metrics` by nothing;
  only `weighted_metrics` take the weights.)"""
  if devices == 2:
    _, result = request.getfixturevalue("regression_run")
  else:
    result = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                            workdir=str(tmp_path), config=CONFIG,
                            strategy=tf.distribute.OneDeviceStrategy(
                                "/cpu:0"))
  x, y, weights = user_task._examples("eval")  # pylint: disable=protected-access
  prediction = result.model(x)
  loss = result.model.compute_loss(y=y, y_pred=prediction,
                                   sample_weight=weights)
  mae = keras.metrics.MeanAbsoluteError()
  mae.update_state(y, prediction)
  assert result.summary["eval_loss"] == pytest.approx(float(loss), rel=1e-5)
  assert result.summary["eval_mae"] == pytest.approx(float(mae.result()),
                                                     rel=1e-5)


# The binary task's metrics (AUC) go through the Python API above in CI; its
# command-line run, the same import-path route, is in the slow set.
@pytest.mark.parametrize("task", [
    "regression", pytest.param("binary", marks=pytest.mark.slow)])
def test_a_users_model_trains_from_the_command_line(tmp_path, task):
  """Import paths resolve from the current folder, as `python -m` sees it."""
  model_name, data_name, metrics = TASKS[task]
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path}",
       f"--config.model.name=user_task:{model_name}",
       f"--config.data.name=user_task:{data_name}",
       *[f"--config.{k}={v}" for k, v in CONFIG.items()
         if k != "log.progress"]], cwd=TESTS)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "done: 12 steps, eval " in result.stdout
  summary = json.loads((tmp_path / "summary.json").read_text())
  _check_outputs(tmp_path, summary, metrics)


def test_a_call_without_training_runs_as_fit_runs_it(tmp_path):
  """Keras' train_step calls self(x) when call() takes no `training`: its
  Dropout stays off (dist_keras had passed training=True, turning it on)."""
  keras.utils.set_random_seed(0)
  fitted = parity_task.call_without_training()
  fitted.fit(parity_task.dataset_fn("train", tf.distribute.InputContext()),
             epochs=1, steps_per_epoch=8, verbose=0, shuffle=False)
  result = helpers.fit_fns(
      parity_task.call_without_training, parity_task.dataset_fn, tmp_path,
      dict(CONFIG, **{"train.steps": 8, "eval.every": 0,
                      "train.global_batch_size": parity_task.GLOBAL_BATCH}))
  for a, b in zip(fitted.get_weights(), result.model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_a_model_built_outside_the_scope_is_refused(tmp_path, mirrored):
  model = user_task.model_fn()  # Built and compiled before fit.
  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(lambda: model, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), config=CONFIG,
                   strategy=mirrored)
  assert "was created outside the strategy's scope" in str(e.value)
  assert not (tmp_path / "run").exists()



def test_a_layer_made_before_model_fn_is_named(tmp_path, mirrored):
  """keras.io's image_classification_from_scratch keeps its augmentation
  layers in a list at import: the refusal named only the variable
  ('seed_generator/seed_generator_state'), not the layer to move."""
  noise = keras.layers.GaussianNoise(0.1, name="noise_at_import")

  def model_fn():
    inputs = keras.Input((user_task.FEATURES,))
    model = keras.Model(inputs, keras.layers.Dense(1)(noise(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    return model

  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"), config=CONFIG,
                   strategy=mirrored)
  assert str(e.value) == (  # (Keras numbers seed generators per process.)
      f"model variable {noise.seed_generator.state.path!r} of layer "
      "GaussianNoise 'noise_at_import' was created outside the strategy's "
      "scope (it is not mirrored): that layer was made before dist_keras "
      "called model_fn (at import, in a list of layers?); create it inside "
      "model_fn, with the rest of the model.")
  assert not (tmp_path / "run").exists()


BAD = [
    ("uncompiled_model_fn", "dataset_fn",
     "model_fn returned model 'functional"),
    ("not_a_model_fn", "dataset_fn",
     "model_fn returned a str, not a keras.Model"),
    ("model_fn", "undropped_remainder_dataset_fn",
     "yields batches of unknown size (x float32[?,6], y float32[?,1]"),
    ("model_fn", "wrong_batch_dataset_fn",
     "yields per-replica batches of 48 examples, but "
     "train.global_batch_size=48 over 2 replica(s) needs 24; batch with "
     "input_context.get_per_replica_batch_size(48), or set "
     "train.global_batch_size=96."),
    ("model_fn", "no_labels_dataset_fn",
     "yields batches without labels (x float32[24,6]), but the compiled "
     "loss 'mse' needs them; yield (x, y) or (x, y, sample_weight) "
     "batches."),
    ("model_fn", "four_tuple_dataset_fn", "yields tuples of 4"),
    ("model_fn", "finite_train_dataset_fn",
     "dataset_fn('train', ...) ends after 3 batches; repeat it"),
    ("onehot_model_fn", "dataset_fn",
     "cannot take the batches of dataset_fn('train', ...) (x float32[24,6],"
     " y float32[24,1], sample_weight float32[24]): Arguments `target` and "
     "`output` must have the same shape"),
    ("model_fn", "not_a_dataset_fn",
     "dataset_fn('train', ...) returned a tuple, not a tf.data.Dataset; "
     "wrap arrays in tf.data.Dataset.from_tensor_slices((x, y)), a "
     "generator or keras.utils.PyDataset in tf.data.Dataset.from_generator"),
    ("sized_model_fn", "dataset_fn",
     "model_fn 'sized_model_fn' cannot be called as model_fn() (missing a "
     "required argument: 'size'); dist_keras calls it so"),
    ("model_fn", "one_argument_dataset_fn",
     "dataset_fn 'one_argument_dataset_fn' cannot be called as "
     "dataset_fn(split, input_context) (too many positional arguments)"),
    ("unreduced_loss_model_fn", "dataset_fn",
     "the compiled loss MeanSquaredError gives a tensor of rank 1 per "
     "batch, not one number (reduction=None?); compile a loss that reduces "
     "to a scalar"),
    ("model_fn", "unbatched_dataset_fn",
     "dataset_fn('train', ...) yields elements whose first dimensions "
     "differ (x float32[6], y float32[1], sample_weight float32[]): are they"
     " batched? batch with input_context.get_per_replica_batch_size(48) and "
     "drop_remainder=True."),
    ("model_fn", "unlabelled_eval_dataset_fn",
     "dataset_fn('eval', ...) yields batches without labels (x "
     "float32[?,6]), but the compiled loss 'mse' needs them"),
    ("model_fn", "unbatched_eval_dataset_fn",
     "dataset_fn('eval', ...) yields x float32[6], y float32[1], "
     "sample_weight float32[], unlike the train split's batches (x "
     "float32[24,6], y float32[24,1], sample_weight float32[24]); batch the "
     "eval split as the train split (ds.batch(...)), with the same "
     "structure."),
    ("model_fn", "no_eval_batches_dataset_fn",
     "dataset_fn('eval', ...) has no batches; give the eval split examples"),
    ("model_fn", "string_labels_dataset_fn",
     "cannot take the batches of dataset_fn('train', ...) (x float32[24,6], "
     "y string[24,1], sample_weight float32[24]): Cast string to float is "
     "not supported [Op:Cast]"),
]


def test_labels_out_of_the_models_range_are_a_user_error(tmp_path):
  """Found by the first step (exit 2 on the command line), not a bug's
  exit 1; the folder the run made goes with its config.json and events
  (they were left, beside a stale lock: 'exit 2 writes nothing')."""
  with pytest.raises(dist_keras.UserError, match=(
      r"^a batch holds a value the model cannot take \(Received a label "
      r"value of \d which is outside the valid range of \[0, 3\)\): ")):
    helpers.fit_fns(user_task.classes_model_fn,
                    user_task.out_of_range_labels_dataset_fn,
                    tmp_path / "run", CONFIG)
  assert not (tmp_path / "run").exists()
  # A folder that was there: the user's own file, and ours, stay.
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("mine")
  with pytest.raises(dist_keras.UserError):
    helpers.fit_fns(user_task.classes_model_fn,
                    user_task.out_of_range_labels_dataset_fn,
                    tmp_path / "mine", CONFIG)
  assert "notes.txt" in os.listdir(tmp_path / "mine")


def test_an_empty_eval_split_is_refused_not_reported_as_loss_0(tmp_path):
  with pytest.raises(dist_keras.UserError, match=(
      r"^dataset_fn\('eval', ...\) gave no examples \(every replica's "
      r"batches were empty\): give the eval split examples")):
    helpers.fit_fns(user_task.model_fn, user_task.empty_eval_dataset_fn,
                    tmp_path / "run", CONFIG)
  assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("model_name,data_name,message", BAD)
def test_bad_user_code_is_one_line_before_anything_is_written(
    tmp_path, mirrored, capsys, model_name, data_name, message):
  config = dict(CONFIG, **{"log.progress": True})
  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(getattr(user_task, model_name),
                   getattr(user_task, data_name),
                   workdir=str(tmp_path / "run"), config=config,
                   strategy=mirrored)
  assert message in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "run").exists()
  assert capsys.readouterr().out == ""  # Not even the header.


def test_a_users_model_on_built_in_data_it_cannot_take_names_the_data(
    tmp_path):
  """Not "dataset_fn('train', ...)", which the user never wrote."""
  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(user_task.model_fn, "longmem", workdir=str(tmp_path / "run"),
                   config=CONFIG)
  assert re.fullmatch(
      r"the model or its compiled loss/metrics cannot take the batches of the "
      r"built-in data.name='longmem' \(train split\) \(x int32\[\d+,\d+\], "
      r"y int32\[\d+\]\): .*expected shape=\(None, 6\), found shape=.*; "
      r"build the model for these batches, or give it your own "
      r"data \(data.name=PKG.MODULE:FN\)", str(e.value)), str(e.value)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name,message", [
    ("no_such_module:model_fn", "model.name='no_such_module:model_fn': "
     "importing no_such_module failed (ModuleNotFoundError: No module named "
     "'no_such_module'); run from the folder that holds it or add that "
     "folder to PYTHONPATH."),
    ("user_task:nothing_here", "model.name='user_task:nothing_here': module "
     "user_task"),
    ("user_task:NOT_CALLABLE", "model.name='user_task:NOT_CALLABLE' names a "
     "int, not a function; name the function that builds it."),
    ("user task:model_fn", "model.name='user task:model_fn' is not "
     "PKG.MODULE:FN (e.g. my_project.models:make_model)."),
    ("broken_user_module:model_fn", "model.name='broken_user_module:model_fn'"
     ": importing broken_user_module failed (ZeroDivisionError: division by "
     "zero)"),
])
def test_bad_import_paths_are_one_line(tmp_path, monkeypatch, name, message):
  from dist_keras.contract import imports  # pylint: disable=g-import-not-at-top
  (tmp_path / "broken_user_module.py").write_text("x = 1 / 0\n")
  monkeypatch.chdir(tmp_path)  # Import paths resolve from here too.
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(dist_keras.UserError) as e:
    imports.load("model.name", name)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_bad_import_path_exits_2_from_the_command_line(tmp_path):
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={tmp_path / 'run'}",
       "--config.model.name=no_such_module:model_fn",
       "--config.data.name=user_task:dataset_fn"],
      cwd=str(tmp_path), env={"PYTHONPATH": f"{helpers.REPO}:{TESTS}"})
  assert result.returncode == 2, result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("dist_keras: error: model.name='no_such_module:"
                         "model_fn': importing no_such_module failed"), line
  assert not (tmp_path / "run").exists() and result.stdout == ""


@pytest.mark.parametrize("key,value,message", [
    ("train.learning_rate", 0.1, "train.learning_rate=0.1 is a setting of "
     "the built-in models, but model.name='user_task:model_fn' is your own: "
     "set it in your model_fn"),
    ("model.units", 8, "model.units=8 is a setting of the built-in models"),
    ("data.train_size", 64, "data.train_size=64 is a setting of the built-in "
     "datasets, but data.name='user_task:dataset_fn' is your own"),
])
def test_settings_only_builtins_read_are_refused_for_a_users_side(
    tmp_path, mirrored, key, value, message):
  with pytest.raises(dist_keras.UserError, match=re.escape(message)):
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                   workdir=str(tmp_path / "run"),
                   config=dict(CONFIG, **{key: value}), strategy=mirrored)


def test_an_empty_replica_batch_never_reaches_the_model(mirrored):
  """3 eval examples in per-replica batches of 1 over 2 replicas: the
  second step leaves replica 1 an empty batch. It counts nowhere and never
  reaches the model (TF 2.21's oneDNN Conv2D+Relu fails on an empty batch
  on AVX-512 hosts; the replica runs one zero example instead, its metrics
  put back), so a model that cannot take one still evaluates every example."""

  class NoEmptyBatch(keras.layers.Layer):
    def call(self, x):
      tf.debugging.assert_positive(tf.shape(x)[0], message="empty batch")
      return x

  x, y, model, result = helpers.eval_three_examples(mirrored, NoEmptyBatch())
  assert result["examples"] == 3
  mae = np.abs(np.asarray(model(x)) - y).mean()
  assert result["mae"] == pytest.approx(mae, rel=1e-6)


class ThreeTokensAtLeast(keras.layers.Layer):
  """Refuses sequences shorter than 3, as a Conv1D of kernel 3 and "valid"
  padding does (its output length would be negative)."""

  def call(self, x):
    tf.debugging.assert_greater_equal(tf.shape(x)[1], 3,
                                      message="shorter than 3")
    return x


# The GRU alone in the slow set: three_tokens_at_least runs the same GRU
# behind a layer that also fails on the zero example's length 0 (the GRU's
# failure), and on 1-2, so it fails wherever the GRU alone would.
@pytest.mark.parametrize("front", [
    pytest.param((), marks=pytest.mark.slow), (ThreeTokensAtLeast,)],
                         ids=["gru", "three_tokens_at_least"])
def test_padded_variable_length_sequences_train_and_evaluate_as_on_one_device(
    tmp_path, mirrored, front):
  """x int32[b, None] padded per batch, at 2 replicas: each replica's train
  batches have their own length, and the last eval step leaves replica 1
  none. Its zero example takes the time length of a replica's real batch
  (the empty batch's is 0: a GRU failed on it, "Tried to stack list which
  only contains uninitialized tensors") and counts nowhere: the losses,
  the accuracy and the weights are one device's."""
  config = dict(CONFIG, **{"train.steps": 8, "eval.every": 4})

  def model_fn():
    return user_task.padded_model_fn(*[layer() for layer in front])

  runs = [dist_keras.fit(model_fn, user_task.padded_dataset_fn,
                         workdir=str(tmp_path / name), config=config,
                         strategy=strategy)
          for name, strategy in (("one", "one_device"), ("two", mirrored))]
  one, two = (run.history for run in runs)
  assert set(two) == {"loss", "accuracy", "val_loss", "val_accuracy"}
  for name, values in one.items():
    np.testing.assert_allclose(two[name], values, rtol=1e-6, atol=1e-7,
                               err_msg=name)
  assert runs[1].summary["eval_examples"] == user_task.PADDED_SIZES["eval"]
  for a, b in zip(runs[0].model.get_weights(), runs[1].model.get_weights()):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_a_builtin_model_trains_on_a_users_data_of_the_declared_shape(
    tmp_path, mirrored):
  """The built-in CNN reads the user's images' shape from data.* keys."""

  def images(split, ctx):
    x = np.random.default_rng(0).uniform(size=(64, 16, 16, 1)).astype(
        "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, (x.mean((1, 2, 3)) > 0.5)
                                             .astype("int32")))
    batch = ctx.get_per_replica_batch_size(user_task.GLOBAL_BATCH)
    if split == "train":
      return ds.repeat().batch(batch, drop_remainder=True)
    return ds.batch(batch)

  config = configs.load("cnn_shapes")
  config.data.image_size, config.data.num_classes = 16, 2
  config.model.filters, config.model.dense_units = (8,), 8
  for key, value in CONFIG.items():
    section, field = key.split(".")
    setattr(config[section], field, value)
  result = dist_keras.fit("cnn", images, workdir=str(tmp_path),
                          config=config, strategy=mirrored)
  assert result.model.input_shape == (None, 16, 16, 1)
  assert result.summary["eval_examples"] == 64


def test_config_overrides_are_checked(tmp_path, mirrored):
  for config, message in [({"train.stepz": 3}, "config['train.stepz'] "
                           "names no config key (did you mean 'steps'?)"),
                          ({"steps": 3}, "config key 'steps' names no setting"),
                          ({"train.steps": "many"}, "config['train.steps']="
                           "'many'")]:
    with pytest.raises(dist_keras.UserError, match=re.escape(message)):
      dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                     workdir=str(tmp_path / "run"), config=config,
                     strategy=mirrored)
  assert not (tmp_path / "run").exists()


def test_saved_models_load_in_a_fresh_process(tmp_path, mirrored):
  """model.keras of every built-in model and of a user's loads with
  keras.models.load_model after `import dist_keras` and nothing else."""
  from dist_keras import data, models  # pylint: disable=g-import-not-at-top
  from dist_keras import registry
  paths = {}
  for name in ("lstm_longmem", "rnn_longmem", "cnn_shapes"):
    c = helpers.tiny_config(name)
    for cell in (("lstm", "gru") if name == "lstm_longmem" else
                 (c.model.cell,)):
      c.model.cell = cell
      model_fn, _ = registry.resolve(c)
      paths[f"{name}_{cell}"] = _saved(model_fn, tmp_path / f"{name}_{cell}")
  lm = helpers.tiny_config("lstm_lm_shakespeare")
  paths["char_lm"] = _saved(models.model_fn(lm, data.InputSpec(
      (6,), "int32", 20, 20, per_token=True)), tmp_path / "lm")
  resnet = configs.load("resnet50_imagenet")
  paths["resnet50"] = _saved(models.model_fn(resnet, data.InputSpec(
      (32, 32, 3), "float32", 10)), tmp_path / "resnet")
  paths["user"] = _saved(user_task.model_fn_dropout, tmp_path / "user")
  code = ("import json, sys\nimport keras\nimport dist_keras\n"
          "for p in json.loads(sys.argv[1]):\n"
          "  m = keras.models.load_model(p)\n"
          "  print(m.name, m.count_params(), m.optimizer.__class__.__name__)")
  result = helpers.run_module(["-c", code, json.dumps(list(paths.values()))],
                              cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(result.stdout.strip().splitlines()) == len(paths)


def _saved(model_fn, folder):
  folder.mkdir()
  model = model_fn()
  path = str(folder / "model.keras")
  model.save(path)
  return path


if __name__ == "__main__":
  sys.exit(pytest.main([__file__]))


def _compiled_with(**compile_args):
  def model_fn():
    model = user_task.model_fn()
    model.compile(optimizer="sgd", loss="mse", **compile_args)
    return model
  return model_fn


@pytest.mark.parametrize("model_fn,config,message", [
    (_compiled_with(run_eagerly=True), {},
     "was compiled with run_eagerly=True; dist_keras runs its steps as "
     "tf.functions"),
    (_compiled_with(steps_per_execution=4), {"train.steps_per_loop": 3},
     r"steps_per_execution=4 but train.steps_per_loop=3; set one of them"),
])
def test_compiled_settings_are_honoured_or_refused(tmp_path, model_fn, config,
                                                   message):
  with pytest.raises(UserError, match=message):
    dist_keras.fit(model_fn, user_task.dataset_fn, workdir=str(tmp_path / "w"),
                   config=dict(CONFIG, **config), strategy="one_device")
  assert not os.path.exists(tmp_path / "w")


def _under_policy(policy):
  """user_task's model built under a Keras policy model_fn sets itself."""
  def model_fn():
    keras.config.set_dtype_policy(policy)
    return user_task.model_fn()
  return model_fn


def test_a_precision_the_model_is_not_built_under_is_refused(tmp_path):
  """train.precision=float16 was said and logged while model_fn's own
  bfloat16 policy trained (no loss scaling either)."""
  previous = keras.config.dtype_policy()
  try:
    with pytest.raises(UserError) as e:
      dist_keras.fit(_under_policy("mixed_bfloat16"), user_task.dataset_fn,
                     workdir=str(tmp_path / "w"), strategy="one_device",
                     config=dict(CONFIG, **{"train.precision": "float16"}))
  finally:
    keras.config.set_dtype_policy(previous)
  assert str(e.value).startswith(
      "train.precision=float16 builds the model under Keras' "
      "'mixed_float16' policy, but model 'functional")
  assert str(e.value).endswith(
      "was built under 'mixed_bfloat16' (set in model_fn?); leave "
      "train.precision at float32 to train under your own policy, or drop "
      "it from model_fn.")
  assert not os.path.exists(tmp_path / "w")


def test_a_policy_model_fn_sets_stays_set_as_after_fit(tmp_path):
  """Keras' fit leaves the global policy as the user set it; dist_keras
  put float32 back after model_fn."""
  previous = keras.config.dtype_policy()
  try:
    dist_keras.fit(_under_policy("mixed_bfloat16"), user_task.dataset_fn,
                   workdir=str(tmp_path / "w"), strategy="one_device",
                   config=dict(CONFIG, **{"train.steps": 2,
                                          "eval.every": 0}))
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
  finally:
    keras.config.set_dtype_policy(previous)


def test_dict_batches_of_features_and_label_say_how_to_split_them(tmp_path):
  def dataset_fn(split, ctx):
    return user_task.dataset_fn(split, ctx).map(
        lambda x, y, w: {"features": x, "label": y})
  with pytest.raises(UserError) as e:
    dist_keras.fit(user_task.model_fn, dataset_fn, workdir=str(tmp_path),
                   config=CONFIG, strategy="one_device")
  assert str(e.value) == (
      "dataset_fn('train', ...) yields batches without labels (x "
      "{features: float32[48,6], label: float32[48,1]}), but the compiled "
      "loss 'mse' needs them; yield (x, y) or (x, y, sample_weight) "
      "batches, e.g. ds.map(lambda d: (d['features'], d['label'])).")


def test_compiled_steps_per_execution_and_jit_compile_are_honoured(
    tmp_path, capsys):
  """Said as the run takes them; config.json keeps what the config asked
  (a rerun compares what the user set, not what the run chose), and
  summary.json's "chosen" what the run took."""
  import json  # pylint: disable=g-import-not-at-top
  result = dist_keras.fit(
      _compiled_with(steps_per_execution=4, jit_compile=True),
      user_task.dataset_fn, workdir=str(tmp_path),
      config={**CONFIG, "log.progress": True}, strategy="one_device")
  out = capsys.readouterr().out
  assert "steps per call: 4 (the model's steps_per_execution)" in out
  assert ("XLA: the model was compiled with jit_compile=True "
          "(train.jit_compile=true)") in out
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    saved = json.load(f)["train"]
  assert (saved["steps_per_loop"], saved["jit_compile"]) == (0, False)
  assert np.isfinite(result.summary["train_loss"])
  # One device: the untimed steps are XLA-compiled whole, update included.
  # Calls stop before each log step's timed one (4, 8, 12): 9-11 the largest.
  assert result.summary["chosen"] == {
      "steps_per_call": 4, "largest_call": 3, "xla": "replica_step",
      "per_replica_batch": user_task.GLOBAL_BATCH}


def test_a_models_own_step_is_not_compiled_across_replicas(tmp_path,
                                                           mirrored):
  with pytest.raises(UserError, match="train.jit_compile=true with Counting's "
                     "own train_step under a multi-device strategy"):
    dist_keras.fit(parity_task.custom_step, parity_task.dataset_fn,
                   workdir=str(tmp_path / "w"),
                   config=dict(CONFIG, **{"train.jit_compile": True}),
                   strategy=mirrored)
  assert not os.path.exists(tmp_path / "w")


def test_a_models_own_step_is_told_its_loss_is_divided_by_replicas(
    tmp_path, mirrored, capsys):
  """As under fit: compute_loss's value is 1/N of the loss, which a tracker
  fed it as Keras' guide does reports; the run's start says so."""
  dist_keras.fit(parity_task.custom_step, parity_task.dataset_fn,
                 workdir=str(tmp_path / "w"),
                 config=dict(CONFIG, **{"train.steps": 2, "eval.every": 0,
                                        "log.progress": True,
                                        "train.global_batch_size": 48}),
                 strategy=mirrored)
  assert ("the loss its self.compute_loss returns is divided by the 2 "
          "replicas, as under fit (a tracker fed it reports 1/2 of the loss:"
          " feed it loss * 2)") in capsys.readouterr().out


def test_an_own_step_that_computes_its_loss_by_hand_is_not_told_of_it(
    mirrored):
  """The division note is about compute_loss: it is said to a step that
  reaches it (through a function it calls, or super()'s), not to a GAN's."""

  class Inherited(keras.Model):
    def train_step(self, data):
      return super().train_step(data)

  train_cfg = types.SimpleNamespace(steps_per_loop=0, jit_compile=False)
  with mirrored.scope():
    models = {"Counting": parity_task.custom_step(), "Gan": parity_task.gan(),
              "Inherited": Inherited()}
  told = {name: any("compute_loss" in note for note in
                    model_checks.as_compiled(model, mirrored, train_cfg))
          for name, model in models.items()}
  assert told == {"Counting": True, "Gan": False, "Inherited": True}


class _LowerLevel(keras.Model):
  """Keras' guide "Customizing what happens in fit", going lower-level: a
  Loss object of its own fed to a loss tracker, in its own train_step and
  test_step (2 replicas log loss and val_loss halved, as fit's do)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.loss_tracker = keras.metrics.Mean(name="loss")
    self.loss_fn = keras.losses.MeanSquaredError()

  @property
  def metrics(self):
    return [self.loss_tracker]

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = self.loss_fn(y, self(x, training=True))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    self.loss_tracker.update_state(loss)
    return {"loss": self.loss_tracker.result()}

  def test_step(self, data):
    x, y = data
    self.loss_tracker.update_state(self.loss_fn(y, self(x, training=False)))
    return {"loss": self.loss_tracker.result()}


class _HandMean(_LowerLevel):
  """Keras' VAE example's way: a loss taken as a mean by hand, which no
  one divides by the replicas (2 replicas train on twice the gradient)."""

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = keras.ops.mean(keras.ops.square(y - self(x, training=True)))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"loss": loss}

  test_step = keras.Model.test_step


@pytest.mark.parametrize("model_class,said", [
    (_LowerLevel, [
        "there is no calibration; the loss its "
        "self.loss_fn (MeanSquaredError) returns is divided by the 2 "
        "replicas, as under fit (a tracker fed it reports 1/2 of the loss: "
        "feed it loss * 2)", "_LowerLevel.test_step is the model's own: the"
        " loss its self.loss_fn (MeanSquaredError) returns is divided by the "
        "2 replicas, as under fit (a tracker fed it reports 1/2 of val_loss:"
        " feed it loss * 2)"]),
    (_HandMean, [
        " | divide _HandMean.train_step's loss by "
        "self.distribute_strategy.num_replicas_in_sync if it is a "
        "keras.ops.mean (2 replicas: 2x one device's gradient, as "
        "under fit): own_models.md, Your own train_step"])])
def test_an_own_steps_loss_object_or_hand_taken_mean_is_said(
    mirrored, model_class, said):
  """Read from the step's code: what Keras divides by the replicas (a
  Loss attribute of a mean reduction, as compute_loss), in train_step and
  test_step; a mean taken by hand, which it does not. One device: not."""
  train_cfg = types.SimpleNamespace(steps_per_loop=0, jit_compile=False)
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  for strategy in (mirrored, one):
    with strategy.scope():
      inputs = keras.Input((user_task.FEATURES,))
      model = model_class(inputs, keras.layers.Dense(1)(inputs))
      model.compile(optimizer="sgd")
    notes = " | ".join(model_checks.as_compiled(model, strategy, train_cfg))
    for line in said:
      assert (line in notes) == (strategy is mirrored), notes
    if model_class is _HandMean and strategy is mirrored:
      hand_mean = notes.split(" | ")[-1]  # A line of its own, short.
      assert hand_mean.startswith("divide ") and len(hand_mean) < 200, notes
  assert "val_loss" not in notes
  if model_class is _HandMean:
    assert "is divided by the" not in notes


def _masked_sequence_model():
  """Per-token logits of an Embedding(mask_zero=True): a masked output."""
  tokens = keras.Input((5,), dtype="int32")
  hidden = keras.layers.Embedding(10, 4, mask_zero=True)(tokens)
  hidden = keras.layers.LSTM(3, return_sequences=True)(hidden)
  model = keras.Model(tokens, keras.layers.Dense(2)(hidden))
  model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
  return model


def _mean_with_sample_weight_model():
  model = user_task.model_fn()
  model.compile(optimizer="sgd", loss=keras.losses.MeanSquaredError(
      reduction="mean_with_sample_weight"))
  return model


@pytest.mark.parametrize("model_fn,count", [
    (_masked_sequence_model, "unmasked outputs (the output has a mask)"),
    (_mean_with_sample_weight_model,
     "sample weights (reduction='mean_with_sample_weight')")])
def test_a_loss_divided_per_replica_is_said(mirrored, model_fn, count):
  """Keras divides a masked loss by each replica's own count of unmasked
  entries (and mean_with_sample_weight by its weights' sum): N replicas
  equal one device only where the counts are equal, which the run says."""
  line = f"the compiled loss is divided by each replica's own sum of {count}"
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  for strategy, said in [(mirrored, True), (one, False)]:
    with strategy.scope():
      model = model_fn()
    notes = model_checks.as_compiled(model, strategy,
                                     configs.load("lstm_longmem").train)
    assert any(line in note for note in notes) == said, notes


@pytest.mark.parametrize("synchronized, frozen", [
    (False, False), (True, False), (False, True)])
def test_per_replica_batch_norm_is_said(mirrored, synchronized, frozen):
  """Keras' BatchNormalization normalises by each replica's own batch
  unless synchronized: N replicas then differ from one device. A frozen
  base (trainable=False, keras.io's fine-tuning) normalises by its moving
  statistics: the same on every replica, not said."""
  with mirrored.scope():
    inner = keras.Sequential([keras.Input((6,)), keras.layers.BatchNormalization(
        synchronized=synchronized, name="bn")])
    inner.trainable = not frozen
    model = keras.Sequential([inner, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
  notes = model_checks.as_compiled(model, mirrored,
                                   configs.load("lstm_longmem").train)
  line = ("1 BatchNormalization layer(s) (bn, ...) normalise by each "
          "replica's own batch of 1/2 of the examples")
  assert any(line in note for note in notes) == (
      not synchronized and not frozen), notes


class SpareOptimizerGan(parity_task.Gan):
  """A GAN holding a third optimizer its train_step never applies (fit
  never builds it). No leading underscore in its name: Keras 3.15 leaves a
  model's name scope open when TensorFlow refuses '_...' as a root scope
  name, and every later variable of the process got its prefix."""

  def __init__(self):
    super().__init__()
    self.spare_optimizer = keras.optimizers.SGD()


def _spare_optimizer_gan():
  model = SpareOptimizerGan()
  model.build((None, 2))
  model.compile()
  return model


def test_an_unbuilt_optimizer_the_step_never_applies_stays_unbuilt(
    tmp_path, mirrored):
  """d_optimizer and g_optimizer, unbuilt, are built from the traced step
  (tests/training/test_step_optimizers.py); the spare one, which the step
  never applies, stays unbuilt as under fit, and 2 replicas train what
  fit trains on one device."""
  keras.utils.set_random_seed(0)
  reference = _spare_optimizer_gan()
  reference.fit(parity_task.images_dataset_fn(
      "train", tf.distribute.InputContext()), epochs=1, steps_per_epoch=2,
                verbose=0, shuffle=False)
  assert not reference.spare_optimizer.built
  result = dist_keras.fit(
      _spare_optimizer_gan, parity_task.images_dataset_fn,
      workdir=str(tmp_path / "w"), config={**CONFIG, "train.steps": 2,
                                           "eval.every": 0},
      strategy=mirrored)
  model = result.model
  assert not model.spare_optimizer.built
  assert model.d_optimizer.built and model.g_optimizer.built
  for got, want in zip(model.weights, reference.weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-6,
                               err_msg=want.path)


def test_batches_are_described_by_their_structure():
  """Dict inputs by their keys (they printed as a tuple of shapes)."""
  spec = ({"ids": tf.TensorSpec([32, 50], tf.int32),
           "mask": tf.TensorSpec([32, None], tf.bool)},
          tf.TensorSpec([32], tf.float32))
  assert batches.describe(spec) == (
      "x {ids: int32[32,50], mask: bool[32,?]}, y float32[32]")
  assert batches.describe(((tf.TensorSpec([3]),) * 2, tf.TensorSpec([3]))) == (
      "x (float32[3], float32[3]), y float32[3]")
