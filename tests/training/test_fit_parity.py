"""What you compile is what trains: dist_keras against Keras' own fit.

Every model of tests/parity_task.py uses one feature a fit user brings (the
model's own train_step, gradient accumulation, EMA, clipping, a loss-scale
optimizer, a schedule, weight-decay exclusions, two outputs, a GAN's two
optimizers, callbacks that stop training, change the rate and keep the best
model). Keras' fit on one device is the reference; dist_keras on one device
must equal it, and 2 replicas and 2 workers must equal one device. Each run
is its own process (tests/scripts/parity_weights.py), started on first use,
several at a time; an Embedding's sparse gradient trains in this process.
"""
import functools
import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import helpers
import parity_task
import parity_weights

SCRIPT = os.path.join(helpers.REPO, "tests", "scripts", "parity_weights.py")
LAUNCHER = os.path.join(helpers.REPO, "tools", "launch_local.py")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO)
MODELS = list(parity_weights.MODELS)
# What distribution can change (each has its own code path across replicas);
# the other models only vary options of the same update (the slow set's 4
# replicas train them all). embedding_adam's 2 replicas train in this
# process (test_an_embeddings_sparse_gradient_trains_what_fit_trains, the
# same comparison, timed); gathered slices untimed: positions_adam's and
# sparse_adam's.
DISTRIBUTED = ("plain,custom_step,custom_loss,accumulate,ema,global_clipnorm,"
               "loss_scale,two_output,gan,callbacks_model,sparse_adam,"
               "sparse_own_step,gan_unflagged,vae,gan_unbuilt,gan_held,"
               "positions_adam,endpoint")
# Across workers (2 processes a model): the acceptance's five, the GAN's
# two optimizers, the callbacks that must stop every worker alike and an
# Embedding's sparse gradient (gathered by the collective runtime; under a
# global-norm clip, its table all-reduced; a large one's gathered beside a
# small one's table; a sparse input's slices of distinct columns, summed
# by column after the gather; a keras.losses.Loss added in the call).
WORKERS = ("custom_step,accumulate,ema,global_clipnorm,two_output,gan,"
           "callbacks_model,embedding_adam,embedding_global_clipnorm,"
           "embeddings_mixed,sparse_adam,endpoint")
# The acceptance's five and the GAN (its two optimizers' state, also held
# in a list and a sub-model's dict): stopped after step 7, then resumed
# from ckpt-4 by a new fit call.
RESUMED = ("custom_step,accumulate,ema,global_clipnorm,two_output,gan,"
           "gan_held")
# Processes, and the runs each writes: one device (Keras' fit, dist_keras,
# dist_keras stopped and resumed) in one, each replica count in its own.
# CI resumes on one device (tolerance 0); the slow set also resumes 2
# replicas ("m2r": 12 more runs, and CI has 15 minutes).
PROCESSES = {
    "one": ["--runs=fit,one,resumed", f"--resumed_models={RESUMED}"],
    "m2": ["--strategy=mirrored", "--devices=2", f"--models={DISTRIBUTED}"],
    "w2": ["--strategy=multi_worker_mirrored", f"--models={WORKERS}"],
    "m4": ["--strategy=mirrored", "--devices=4"],
    "m2r": ["--strategy=mirrored", "--devices=2", "--runs=resumed",
            f"--resumed_models={RESUMED}"],
}
# run name -> (process, its run).
RUNS = {"fit": ("one", "fit"), "one": ("one", "one"),
        "one_resumed": ("one", "resumed"), "m2": ("m2", "one"),
        "m2_resumed": ("m2r", "resumed"), "w2": ("w2", "one"),
        "m4": ("m4", "one")}
GROUPS = (("one", "m2", "w2"), ("m4", "m2r"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """`runs[name]`: {key: array} of run `name`; its group of processes
  starts (in parallel) on first use."""
  out = tmp_path_factory.mktemp("parity")
  started = functools.cache(lambda group: _once(out, group))

  class ByName:
    folder = out

    def __getitem__(self, name):
      process, run = RUNS[name]
      (group,) = [g for g in GROUPS if process in g]
      failed = started(group)
      if failed:
        raise failed
      return dict(np.load(out / f"{process}_{run}_0.npz"))

  return ByName()


def _command(out, process):
  command = [SCRIPT, *PROCESSES[process],
             f"--out={out / process}_{{run}}_{{task}}.npz"]
  if process == "w2":
    return [LAUNCHER, "--num_workers=2", "--", sys.executable, *command]
  return command


def _scratch(out):
  folder = out / "tmp"
  folder.mkdir(exist_ok=True)
  return folder


def _once(out, group):
  """_run_group, whose failure every later test of the group re-raises
  (functools.cache keeps no exception: each of the ~70 tests reran the
  group, a 900 s timeout each on a loaded host). pytest-timeout's own
  failure (pytest.fail's, no Exception: it comes first, the group's own
  timeout starts later) is kept too."""
  try:
    _run_group(out, group)
  except (Exception, pytest.fail.Exception) as e:  # pylint: disable=W0718
    return e
  return None


def _run_group(out, group):
  procs = {name: subprocess.Popen(
      [sys.executable, *_command(out, name)], stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True,
      # A temporary folder of the group's own: the test below looks for
      # the other worker's scratch copy there (another session's runs may
      # have theirs in the machine's).
      env=dict(ENV, PARITY_BEST=str(out / f"best_{name}.keras"),
               TMPDIR=str(_scratch(out))))
           for name in group}
  try:
    for name, proc in procs.items():
      log, _ = proc.communicate(timeout=900)
      assert proc.returncode == 0, f"{name} failed:\n{log[-3000:]}"
  finally:  # A failed or timed-out group leaves no process training on.
    helpers.stop(procs.values())


def _weights(run, model):
  return {k: v for k, v in run.items() if k.startswith(f"{model}/")}


@pytest.mark.parametrize("model", MODELS)
def test_one_device_trains_what_keras_fit_trains(runs, model):
  fit, ours = runs["fit"], runs["one"]
  weights = _weights(fit, model)
  assert weights and weights.keys() == _weights(ours, model).keys()
  for key, expected in weights.items():
    np.testing.assert_allclose(ours[key], expected, rtol=0, atol=1e-6,
                               err_msg=key)
    moved = np.abs(expected - fit[f"initial/{key}"]).max()
    assert moved > 1e-4 or key.endswith("/calls"), f"{key} never trained"


def test_a_plain_model_is_bitwise_keras_fit(runs):
  for key, expected in _weights(runs["fit"], "plain").items():
    np.testing.assert_array_equal(runs["one"][key], expected, err_msg=key)


@pytest.mark.parametrize("run,model", [
    *[("m2", model) for model in DISTRIBUTED.split(",")],
    *[("w2", model) for model in WORKERS.split(",")],
    *[pytest.param("m4", model, marks=pytest.mark.slow) for model in MODELS]])
def test_replicas_and_workers_train_what_one_device_trains(runs, run, model):
  one = _weights(runs["one"], model)
  for key, expected in one.items():
    np.testing.assert_allclose(runs[run][key], expected, rtol=0, atol=1e-5,
                               err_msg=key)


def test_the_models_own_train_step_ran_every_step(runs):
  for run in ("fit", "one", "m2", "w2", "one_resumed"):
    (calls,) = [v for k, v in runs[run].items()
                if k.startswith("custom_step/") and k.endswith("/calls")]
    assert int(calls) == parity_weights.STEPS, run


@pytest.mark.parametrize("run", ["one", "m2", "w2",
                                 pytest.param("m4", marks=pytest.mark.slow)])
def test_every_loss_and_metric_of_the_eval_is_exact(runs, run):
  """Two outputs, 200 examples: the last batch is partial at every replica
  count; each output's loss and metric is the whole split's."""
  expected = {k: v for k, v in runs["fit"].items()
              if k.startswith("eval/two_output/")}
  assert {k.rsplit("/", 1)[1] for k in expected} >= {
      "loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"}
  for key, value in expected.items():
    # The weights agree to 1e-5; a mis-weighted partial batch moved a
    # per-output loss by ~2% (3.0726 against 3.0145).
    assert runs[run][key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.parametrize("run", ["m2", "w2",
                                 pytest.param("m4", marks=pytest.mark.slow)])
def test_a_loss_object_added_in_the_call_is_evaluated_as_on_one_device(
    runs, run):
  """Keras divided it by the replicas twice: half the eval_loss at 2."""
  key = "eval/endpoint/loss"
  assert runs[run][key] == pytest.approx(runs["one"][key], rel=1e-5)


@pytest.mark.parametrize("run", ["one", "m2", "w2"])
def test_callbacks_stop_change_the_rate_and_keep_the_best_as_under_fit(
    runs, run):
  """EarlyStopping stops at fit's epoch, ReduceLROnPlateau's rate is fit's,
  ModelCheckpoint(save_best_only) keeps fit's best model."""
  fit, ours = runs["fit"], runs[run]
  name = "callbacks_model"
  assert fit[f"steps/{name}"] < parity_weights.EPOCH * parity_weights.EPOCHS
  assert ours[f"steps/{name}"] == fit[f"steps/{name}"]
  assert fit[f"lr/{name}"] < 0.05  # Reduced at least once.
  assert ours[f"lr/{name}"] == pytest.approx(fit[f"lr/{name}"])
  np.testing.assert_allclose(ours[f"val_loss/{name}"],
                             fit[f"val_loss/{name}"], rtol=1e-5)
  for key, value in fit.items():
    if key.startswith(f"best/{name}/"):
      np.testing.assert_allclose(ours[key], value, rtol=0, atol=1e-5)


def test_only_the_chief_wrote_the_best_model(runs):
  """The other worker wrote its copy to a scratch folder, deleted after."""
  runs["w2"]  # pylint: disable=pointless-statement
  folder = runs.folder
  assert glob.glob(str(folder / "**" / "best_w2*"), recursive=True) == [
      str(folder / "best_w2.keras")]
  assert not glob.glob(os.path.join(_scratch(folder), "dist_keras_worker_*",
                                    "**", "best_w2*"), recursive=True)


@pytest.mark.parametrize("run,tolerance", [
    ("one", 0.0), pytest.param("m2", 1e-6, marks=pytest.mark.slow)])
@pytest.mark.parametrize("model", RESUMED.split(","))
def test_stopped_and_resumed_ends_where_an_uninterrupted_run_ends(
    runs, run, tolerance, model):
  """Stopped after step 7, resumed from ckpt-4 by a new fit call (a new
  model and optimizer: only the checkpoint carries state). Accumulators
  mid-cycle (step 4 of cycles of 3), EMA copies, the step's own counter,
  both GAN optimizers (held as attributes, in a list, in a sub-model's
  dict): all in the checkpoint."""
  resumed = runs[f"{run}_resumed"]
  assert resumed[f"resumed_from/{model}"] == 4
  for key, expected in _weights(runs[run], model).items():
    np.testing.assert_allclose(resumed[key], expected, rtol=0,
                               atol=tolerance, err_msg=key)


def test_a_models_own_step_is_timed_as_input_wait_and_model_step(runs):
  assert str(runs["one"]["sync_split/custom_step"]) == "model_step"
  assert str(runs["one"]["sync_split/plain"]) == "None"  # Timing off.


def _embedding_weights(workdir, strategy, name) -> dict:
  """The weights dist_keras trains parity_task's model `name` to, keyed
  as parity_weights keys them."""
  return _embedding_run(workdir, strategy, name)[0]


def _embedding_run(workdir, strategy, name, **config):
  """(the weights, summary.json) of dist_keras training model `name`."""
  settings = {k: v for k, v in parity_weights.config(
      name, 1, "one_device").items() if not k.startswith("runtime.")}
  result = dist_keras.fit(getattr(parity_task, name),
                          parity_task.tokens_dataset_fn, workdir=str(workdir),
                          config={**settings, **config}, strategy=strategy)
  return parity_weights.weights(name, result.model), result.summary


def _one_device(runs, tmp_path, name) -> dict:
  """One device's weights of model `name`: the one process's run (its
  models), else trained here."""
  if name in MODELS:
    return _weights(runs["one"], name)
  return _embedding_weights(tmp_path / "one",
                            tf.distribute.OneDeviceStrategy("/cpu:0"), name)


def test_an_embeddings_sparse_gradient_trains_what_fit_trains(tmp_path,
                                                              mirrored, runs):
  """An Embedding's gradient is a tf.IndexedSlices, a slice per looked-up
  token, and Adam squares each slice before a repeated token's add up, as
  fit hands them to it: summed into a dense gradient first, the weights
  ended 0.11 from fit's. One device = fit (the one process's runs, as
  every model's); 2 replicas, whose slices are gathered (not summed), =
  one device, their timed steps and calibration included (in this
  process: the 2 replicas every test process has)."""
  name = "embedding_adam"
  fit, one = _weights(runs["fit"], name), _one_device(runs, tmp_path, name)
  two, _ = _embedding_run(tmp_path / "m2", mirrored, name,
                          **{"log.sync_timing": True,
                             "log.calibration_steps": 3})
  assert fit and fit.keys() == one.keys() == two.keys()
  for key, expected in fit.items():
    moved = np.abs(expected - runs["fit"][f"initial/{key}"]).max()
    assert moved > 1e-4, f"{key} never trained"
    np.testing.assert_allclose(one[key], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(two[key], one[key], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,clip,gathered,summed", [
    ("embedding_global_clipnorm", 0.01, (), True),
    ("embedding_clipnorm", 0.01, (0,), False),
    ("embeddings_mixed", 0.01, (1,), True)])
def test_an_embeddings_clipped_gradient_trains_what_one_device_trains(
    tmp_path, mirrored, runs, name, clip, gathered, summed):
  """Clipped by Adam's global_clipnorm, an Embedding's slices reach Adam
  as a dense table (Keras' clip densifies them): 2 replicas sum each
  replica's slices into it and all-reduce it, and clip with the norm Keras
  takes from the slices (training/sparse_grads.py), gathering nothing.
  Clipped per variable (clipnorm), Adam sees the clipped slices: gathered.
  Two Embeddings under one global-norm clip, the large one's slices
  gathered (its table sends more), the small one's table all-reduced: one
  norm clips both. Either way 2 replicas, timed steps and calibration
  included, = one device, with the clip scaling (the first batch's
  Embedding gradient alone is past it). `gathered`: the Embeddings whose
  slices a replica gathers (24 examples of 5 tokens, 4 float32s and an
  int32 index a slice), not their tables; `summed`: whether one is summed
  (with the float32 sum of its slices' squares). One device: the one
  process's run where it trains the model, else this process's."""
  keras.utils.set_random_seed(0)
  model = getattr(parity_task, name)()
  (x, y), = parity_task.tokens_dataset_fn(
      "train", tf.distribute.InputContext()).take(1)
  with tf.GradientTape() as tape:
    loss = model.compute_loss(x, y, model(x, training=True))
  slices = tape.gradient(loss, model.trainable_variables)[0]
  assert isinstance(slices, tf.IndexedSlices)
  assert float(tf.norm(slices.values)) > 2 * clip
  one = _one_device(runs, tmp_path, name)
  two, summary = _embedding_run(tmp_path / "m2", mirrored, name,
                                **{"log.sync_timing": True,
                                   "log.calibration_steps": 3})
  per_replica = parity_task.GLOBAL_BATCH // 2 * parity_task.TOKENS
  assert summary["gathered_bytes"] == len(gathered) * per_replica * (4 * 4
                                                                   + 4)
  nbytes = [v.numpy().nbytes for v in model.trainable_variables]
  assert summary["gradient_bytes"] == sum(nbytes) - sum(
      nbytes[i] for i in gathered) + 4 * summed
  assert one and one.keys() == two.keys()
  for key, want in one.items():
    np.testing.assert_allclose(two[key], want, rtol=0, atol=1e-5,
                               err_msg=key)
