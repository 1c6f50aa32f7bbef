"""The TPU runtime's environment (distribute/tpu_env.py), set before
TensorFlow starts: the PJRT variables on TPU v5e/v5p/v6e, nothing elsewhere,
a user's own values kept. No TPU here: a fake `libtpu` package and TPU
markers (a device path, TPU_ACCELERATOR_TYPE) stand in for one.
"""
import os
import sys

import pytest

import helpers
from dist_keras.distribute import tpu_env

LIBRARY = "/opt/libtpu/libtpu.so"
PJRT = {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": LIBRARY}


def _prepare(strategy="auto", tpu="local", environ=None, paths=(),
             library=LIBRARY):
  environ = {} if environ is None else environ
  set_now = tpu_env.prepare(strategy, tpu, environ, lambda p: p in paths,
                            lambda: library)
  return set_now, environ


@pytest.mark.parametrize("strategy,environ,paths", [
    ("tpu", {}, ("/dev/vfio/0",)),  # v5e/v5p/v6e TPU VM.
    ("auto", {}, ("/dev/vfio/vfio", "/dev/vfio/3")),
    ("auto", {"TPU_ACCELERATOR_TYPE": "v6e-1"}, ()),  # Colab's v6e-1.
    ("tpu", {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, ()),  # Colab's v5e-1.
])
def test_a_pjrt_tpu_gets_the_pjrt_variables(strategy, environ, paths):
  set_now, env = _prepare(strategy, environ=environ, paths=paths)
  assert set_now == PJRT
  assert {k: env[k] for k in PJRT} == PJRT


def test_a_users_own_values_win():
  mine = {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "false"}
  set_now, env = _prepare("tpu", environ=dict(mine), paths=("/dev/vfio/0",))
  assert set_now == {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": LIBRARY}
  assert env == {**mine, **set_now}


@pytest.mark.parametrize("strategy,tpu,environ,paths,library", [
    ("auto", "local", {}, (), LIBRARY),  # No TPU here.
    ("mirrored", "local", {}, ("/dev/vfio/0",), LIBRARY),  # Not asked for.
    ("tpu", "local", {}, ("/dev/accel0",), LIBRARY),  # v2-v4: classic.
    ("tpu", "local", {"TPU_ACCELERATOR_TYPE": "v4-8"}, (), LIBRARY),
    ("tpu", "my-tpu-node", {}, ("/dev/vfio/0",), LIBRARY),  # A TPU node.
    ("tpu", "local", {}, ("/dev/vfio/0",), None),  # No libtpu package.
])
def test_nothing_changes_elsewhere(strategy, tpu, environ, paths, library):
  before = dict(environ)
  set_now, env = _prepare(strategy, tpu, environ, paths, library)
  assert set_now == {} and env == before


def _fake_libtpu(tmp_path):
  """A `libtpu` package whose library is a file TensorFlow cannot load."""
  package = tmp_path / "site" / "libtpu"
  package.mkdir(parents=True)
  (package / "libtpu.so").write_text("not a library")
  (package / "__init__.py").write_text(
      "import os\n"
      "def get_library_path():\n"
      "  return os.path.join(os.path.dirname(__file__), 'libtpu.so')\n")
  return str(tmp_path / "site"), str(package / "libtpu.so")


def _cli(tmp_path, site, **env):
  clean = {k: v for k, v in os.environ.items()
           if k not in PJRT and not k.startswith("TPU_")}
  return helpers.run_module(
      ["-m", "dist_keras.train", "--verbose", "--config.runtime.strategy=tpu",
       f"--workdir={tmp_path / 'run'}"],
      env={**clean, "PYTHONPATH": os.pathsep.join([site, helpers.REPO]),
           **env}, timeout=120)


def test_the_cli_sets_them_before_tensorflow_starts(tmp_path):
  """TensorFlow, imported after, tries to load the fake library: it started
  with the variables set. The failure is one line naming the library."""
  site, library = _fake_libtpu(tmp_path)
  result = _cli(tmp_path, site, TPU_ACCELERATOR_TYPE="v5litepod-1")
  assert result.returncode == 2, result.stderr[-2000:]
  assert ("dist_keras: TPU runtime (PJRT): set PJRT_DEVICE=TPU, "
          "NEXT_PLUGGABLE_DEVICE_USE_C_API=true, "
          f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={library}") in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("dist_keras: error: TensorFlow could not load the "
                         f"TPU runtime {library}")
  assert not (tmp_path / "run").exists()


def test_the_cli_keeps_a_users_values(tmp_path):
  site, _ = _fake_libtpu(tmp_path)
  result = _cli(tmp_path, site, TPU_ACCELERATOR_TYPE="v5litepod-1",
                TF_PLUGGABLE_DEVICE_LIBRARY_PATH="/my/own/libtpu.so")
  assert ("dist_keras: TPU runtime (PJRT): set PJRT_DEVICE=TPU, "
          "NEXT_PLUGGABLE_DEVICE_USE_C_API=true\n") in result.stderr
  assert "/my/own/libtpu.so" in result.stderr  # TensorFlow tried MY path.
  assert result.returncode != 0


def test_without_a_tpu_the_cli_sets_nothing_and_fails_as_before(tmp_path):
  site, _ = _fake_libtpu(tmp_path)
  result = _cli(tmp_path, site)
  assert "dist_keras: TPU runtime: no variable set" in result.stderr
  assert result.returncode == 2
  assert "runtime.strategy='tpu' but no TPU was found" in result.stderr


def test_prepare_runtime_after_tensorflow_says_it_is_too_late(tmp_path):
  site, _ = _fake_libtpu(tmp_path)
  code = ("import tensorflow, dist_keras\n"
          "print(sorted(dist_keras.prepare_runtime('tpu')))\n")
  result = helpers.run_module(
      ["-c", code], env={"PYTHONPATH": os.pathsep.join([site, helpers.REPO]),
                         "TPU_ACCELERATOR_TYPE": "v6e-1"})
  assert result.returncode == 0, result.stderr[-2000:]
  assert "TensorFlow was imported before the TPU runtime was set up" in (
      result.stderr)
  assert result.stdout.strip() == str(sorted(PJRT))


def test_dist_keras_import_stays_tensorflow_free():
  code = ("import sys, dist_keras\n"
          "dist_keras.prepare_runtime()\n"
          "print('tensorflow' in sys.modules)\n")
  result = helpers.run_module(["-c", code])
  assert result.returncode == 0 and result.stdout.strip() == "False", (
      result.stderr[-2000:])


def test_tpu_env_is_what_the_tpu_module_detects_with():
  from dist_keras.distribute import tpus  # pylint: disable=g-import-not-at-top
  assert tpus.detect is tpu_env.detect
  assert sys.modules["dist_keras.distribute.tpu_env"] is tpu_env


def test_a_tpu_run_at_one_step_per_call_gets_a_hint():
  from dist_keras.training import settings  # pylint: disable=g-import-not-at-top
  c = helpers.tiny_config()
  c.train.steps_per_loop = 1
  hint = "TPU: train.steps_per_loop=1 returns to the host after every step"
  assert any(n.startswith(hint) for n in settings.notes(c, True))
  assert not any(n.startswith(hint) for n in settings.notes(c, False))
  c.train.steps_per_loop = 50
  assert not any(n.startswith(hint) for n in settings.notes(c, True))
