"""Installed from a wheel, without the checkout: the default built-in config
runs by name from any directory; a user's config file elsewhere, naming
their own model and data in a module of theirs that it imports, trains
through the console script, and the same functions through dist_keras.fit;
the local launcher's console script starts a 2-worker cluster."""
import os
import shutil
import subprocess
import sys
import zipfile

import helpers

SOURCES = ("setup.py", "pyproject.toml", "README.md", "dist_keras", "configs")
# What the README's commands run, shipped in the package (not tools/).
SHIPPED = ("dist_keras/launch/__main__.py", "dist_keras/launch/cli.py",
           "dist_keras/launch/cluster.py", "dist_keras/commands.py",
           "dist_keras/prepare_data.py")
FEW_STEPS = ["--config.train.steps=4", "--config.train.log_every=2",
             "--config.eval.every=0", "--config.data.train_size=256",
             "--config.data.eval_size=64", "--config.log.calibration_steps=0",
             "--config.log.peak_tflops=1.0"]
NO_EDITABLE_HOOK = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
                    "if 'editable' not in repr(f)]; ")
OWN_STEPS = ["--config.train.steps=4", "--config.train.log_every=2",
             "--config.eval.every=0", "--config.log.calibration_steps=0",
             "--config.log.peak_tflops=1.0"]
USER_CONFIG = '''from dist_keras.configs import base

import mymodels  # The user's module, beside this file (the working folder).


def get_config():
  c = base.get_config()
  c.model.name = "mymodels:model_fn"
  c.data.name = "mymodels:dataset_fn"
  c.train.global_batch_size = mymodels.GLOBAL_BATCH
  return c
'''
USER_MODULE = '''import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 32


def model_fn():
  inputs = keras.Input((8,))
  hidden = keras.layers.Dense(16, activation="relu")(inputs)
  model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
  model.compile(optimizer="adam", metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def dataset_fn(split, input_context):
  rng = np.random.default_rng(0 if split == "train" else 1)
  x = rng.normal(size=(256, 8)).astype("float32")
  ds = tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype("int32")))
  ds = ds.shard(input_context.num_input_pipelines,
                input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    return ds.repeat().batch(batch, drop_remainder=True)
  return ds.batch(batch)
'''
FIT = ("import dist_keras, mymodels; r = dist_keras.fit(mymodels.model_fn, "
       "mymodels.dataset_fn, workdir='fit', config={'train.steps': 4, "
       "'train.global_batch_size': 32, 'eval.every': 0, "
       "'log.calibration_steps': 0, 'log.peak_tflops': 1.0}); "
       "print(dist_keras.__file__, r.summary['eval_accuracy'])")


def _start(args, cwd, site):
  return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=str(site),
                                   TF_CPP_MIN_LOG_LEVEL="2"))


def _finished(proc):
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  return out


def test_an_installed_wheel_runs_from_an_unrelated_directory(tmp_path):
  source = tmp_path / "source"  # A copy: the build writes next to it.
  source.mkdir()
  for name in SOURCES:
    path = os.path.join(helpers.REPO, name)
    if os.path.isdir(path):
      shutil.copytree(path, source / name,
                      ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy(path, source / name)
  built = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
       "--no-build-isolation", str(source), "-w", str(tmp_path / "wheel")],
      capture_output=True, text=True, timeout=300, check=False)
  assert built.returncode == 0, built.stderr[-3000:]
  (wheel,) = (tmp_path / "wheel").iterdir()
  names = zipfile.ZipFile(wheel).namelist()
  assert "dist_keras/configs/lstm_longmem.py" in names
  assert set(SHIPPED) <= set(names)
  assert not [n for n in names if n.startswith("tools/")]
  (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
  assert "dist-keras-launch = dist_keras.launch.cli:main" in zipfile.ZipFile(
      wheel).read(entry_points).decode()
  site = tmp_path / "site"
  installed = subprocess.run(
      [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
       f"--target={site}", str(wheel)], capture_output=True, text=True,
      timeout=300, check=False)
  assert installed.returncode == 0, installed.stderr[-3000:]
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()

  (elsewhere / "mine.py").write_text(USER_CONFIG)
  (elsewhere / "mymodels.py").write_text(USER_MODULE)
  # Independent runs, started together: their start-ups overlap. The
  # default (a built-in config, by name: the --config flag's default)
  # through `python -m`; the user's file through the console script (two
  # TensorFlow runs: CI has 15 minutes).
  found = _start([sys.executable, "-c", "import dist_keras.configs as c; "
                  "print(c.__file__)"], elsewhere, site)
  default = _start([sys.executable, "-m", "dist_keras.train",
                    "--workdir=default", *FEW_STEPS], elsewhere, site)
  script = _start([str(site / "bin" / "dist-keras-train"), "--config=mine.py",
                   "--workdir=own", *OWN_STEPS], elsewhere, site)
  fit = _start([sys.executable, "-c", FIT], elsewhere, site)
  launch = _start([str(site / "bin" / "dist-keras-launch"), "--num_workers=2",
                   "--", sys.executable, "-c", helpers.TWO_WORKERS],
                  elsewhere, site)
  # From inside a checkout (a Docker WORKDIR holding the source, a notebook
  # that %cd's into its clone), the working directory's dist_keras shadows
  # the installed one; with no editable install's import hook, its
  # configs/ must still be dist_keras.configs (it was ModuleNotFoundError).
  in_checkout = _start([sys.executable, "-c", NO_EDITABLE_HOOK
                        + "import dist_keras.configs as c; print(c.__file__)"],
                       source, site)
  out, err = launch.communicate(timeout=60)
  helpers.check_two_workers(subprocess.CompletedProcess(
      launch.args, launch.returncode, out, err))
  assert _finished(found).startswith(str(site))  # Not the checkout.
  assert _finished(in_checkout).strip() == str(
      source / "configs" / "__init__.py")
  assert "done: 4 steps, eval accuracy" in _finished(default)
  assert '"cell": "lstm"' in (elsewhere / "default" /
                              "config.json").read_text()
  assert "done: 4 steps, eval accuracy" in _finished(script)
  assert '"name": "mymodels:model_fn"' in (elsewhere / "own" /
                                           "config.json").read_text()
  installed_at, accuracy = _finished(fit).split()[-2:]
  assert installed_at.startswith(str(site)) and 0 <= float(accuracy) <= 1
