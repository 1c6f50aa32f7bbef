"""Every bad config value is refused before anything is written or trained:
one line naming the value and the fix (dist_keras/validate.py; the ones
only the strategy or the model can tell, where those are known)."""
import os

import pytest

import helpers
from dist_keras import configs, validate
from dist_keras.errors import UserError


@pytest.mark.parametrize("override,message", [
    ("model.name=transformer", "model.name='transformer' is not one of"),
    ("model.cell=transformer", "model.cell='transformer' is not one of"),
    ("data.name=imagenet", "data.name='imagenet' is not one of"),
])
def test_bad_names_are_refused_without_tensorflow(override, message):
  """The command line's check of a typo'd name takes a fraction of a second:
  validate.config refuses it before anything imports TensorFlow."""
  code = ("import sys\n"
          "from dist_keras import configs, validate\n"
          f"c = configs.from_command_line('lstm_longmem', [{override!r}])\n"
          "try:\n  validate.config(c)\n"
          "except Exception as e:\n  print(type(e).__name__, e)\n"
          "assert 'tensorflow' not in sys.modules\n")
  result = helpers.run_module(["-c", code], timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("UserError ") and message in result.stdout
  # A user's own model reads no model.cell: not refused there.
  c = configs.from_command_line("lstm_longmem", ["model.name=pkg.mod:fn",
                                                 "model.cell=transformer"])
  from dist_keras import validate  # pylint: disable=g-import-not-at-top
  validate.config(c)


def test_a_workdir_under_a_file_is_refused_creating_nothing(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(UserError, match=(
      rf"--workdir={blocker}/run/a is not writable \({blocker} is a file\); "
      "pass a folder you can write to.")):
    validate.workdir(str(blocker / "run" / "a"))
  validate.workdir(str(tmp_path / "new" / "run"))  # Made later, by the chief.
  validate.workdir("gs://bucket/run")  # Checked when first written.
  assert os.listdir(tmp_path) == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_workdir_in_a_read_only_folder_is_refused(tmp_path):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o555)
  with pytest.raises(UserError, match=f"\\({locked} is not writable\\)"):
    validate.workdir(str(locked / "run"))


def test_negative_bytes_per_pack_is_refused_before_training(tmp_path,
                                                            mirrored):
  c = helpers.tiny_config()
  c.runtime.bytes_per_pack = -1
  with pytest.raises(ValueError, match="runtime.bytes_per_pack=-1 must be"):
    helpers.train(c, str(tmp_path), mirrored)
  assert not os.listdir(tmp_path)


def test_a_negative_heartbeat_interval_is_refused():
  c = helpers.tiny_config()
  c.log.progress_seconds = -1.0
  with pytest.raises(UserError, match=(
      r"log.progress_seconds=-1.0 must be >= 0 \(0: progress lines at "
      r"train.log_every steps only\)")):
    validate.config(c)


def test_unknown_allreduce_dtype_is_refused(tmp_path, mirrored):
  c = helpers.tiny_config()
  c.runtime.allreduce_dtype = "int8"
  with pytest.raises(ValueError,
                     match="runtime.allreduce_dtype='int8' is not one of"):
    helpers.train(c, str(tmp_path), mirrored)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("key,value,message", [
    ("steps", 0, "train.steps=0 must be >= 1"),
    ("global_batch_size", 31, "global_batch_size=31 is not divisible by the 2"),
    ("learning_rate", -1.0, "learning_rate=-1.0 must be > 0"),
    ("optimizer", "lbfgs", "train.optimizer='lbfgs' is not one of sgd"),
    ("momentum", 1.0, r"train.momentum=1.0 must be in \[0, 1\)"),
    ("momentum", 0.9, "train.momentum=0.9 does nothing with "
     "train.optimizer='adam' .* use it with sgd or rmsprop"),
])
def test_bad_train_settings_fail_before_writing(tmp_path, mirrored, key, value,
                                                message):
  c = helpers.tiny_config()
  setattr(c.train, key, value)
  with pytest.raises(ValueError, match=message):
    helpers.train(c, str(tmp_path), mirrored)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("key,value,message", [
    ("train.max_checkpoints", 0, "train.max_checkpoints=0 must be >= 1."),
    ("data.seq_len", 0, "data.seq_len=0 must be >= 1."),
    ("data.eval_size", 0, "data.eval_size=0 must be >= 1."),
    ("data.train_size", 0, "data.train_size=0 must be >= 1."),
    ("data.num_classes", 1, "data.num_classes=1 must be >= 2."),
    ("data.shuffle_buffer", -5,
     "data.shuffle_buffer=-5 must be >= 1 (1: no shuffling)."),
    ("data.noise", -1.0, "data.noise=-1.0 must be >= 0."),
    ("model.embed_dim", -1, "model.embed_dim=-1 must be >= 1."),
    ("model.filters", (1.5,), "model.filters=(1.5,) must be whole numbers >= "
     "1, one per conv block"),
    ("model.filters", (), "model.filters=() must be whole numbers"),
])
def test_bad_sizes_are_refused_without_tensorflow(key, value, message):
  """Each was a TensorFlow or Keras traceback (exit 1), or trained on."""
  c = configs.load("lstm_longmem")
  section, field = key.split(".")
  setattr(c[section], field, value)
  with pytest.raises(UserError) as e:
    validate.config(c)
  assert str(e.value) == message or str(e.value).startswith(message)


@pytest.mark.parametrize("spec", ["1,4", "5,3", "a,b", "7"])
def test_bad_profile_steps_are_refused(tmp_path, mirrored, spec):
  c = helpers.tiny_config()
  c.log.profile_steps = spec
  with pytest.raises(ValueError, match="log.profile_steps="):
    helpers.train(c, str(tmp_path), mirrored)
  assert not os.listdir(tmp_path)


def test_unknown_precision_is_refused(tmp_path, mirrored):
  c = helpers.tiny_config()
  c.train.precision = "float8"
  with pytest.raises(ValueError, match="train.precision='float8' is not one"):
    helpers.train(c, str(tmp_path), mirrored)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("key,value,message", [
    ("runtime.seed", -1, "runtime.seed=-1 is outside 0..4294967295 "
     "(TensorFlow's seed range); pick a seed in it."),
    ("runtime.seed", 2**32, "runtime.seed=4294967296 is outside 0..4294967295"),
    ("train.learning_rate", float("inf"),
     "train.learning_rate=inf must be > 0 and finite."),
    ("train.learning_rate", float("nan"),
     "train.learning_rate=nan must be > 0 and finite."),
    ("log.progress_seconds", float("nan"), "log.progress_seconds=nan must be "
     "a finite number >= 0 (0: progress lines at train.log_every steps only)."),
    ("log.progress_seconds", float("inf"),
     "log.progress_seconds=inf must be a finite number >= 0"),
    ("log.calibration_steps", -1, "log.calibration_steps=-1 must be >= 0 "
     "(0: no all-reduce calibration after training)."),
    ("runtime.timeout_seconds", float("inf"),
     "runtime.timeout_seconds=inf must be a finite number >= 0"),
    ("runtime.peer_start_timeout_seconds", -1.0,
     "runtime.peer_start_timeout_seconds=-1.0 must be >= 0 (0: no limit)."),
    ("runtime.peer_start_timeout_seconds", float("nan"),
     "runtime.peer_start_timeout_seconds=nan must be a finite number >= 0"),
    ("train.global_clipnorm", float("nan"),
     "train.global_clipnorm=nan must be a finite number >= 0"),
    ("log.peak_tflops", float("inf"),
     "log.peak_tflops=inf must be a finite number >= 0"),
    ("data.noise", float("nan"), "data.noise=nan must be a finite number >= 0."),
    ("runtime.num_cpu_devices", 100000, "runtime.num_cpu_devices=100000 is "
     "more than train.global_batch_size=256 (each replica needs at least one "
     "example); use at most 256."),
])
def test_out_of_range_and_non_finite_values_are_refused(key, value, message):
  """Each passed validation: a seed failed after TensorFlow's start-up (exit
  1), learning_rate=inf trained to a divergence (exit 3), 100000 CPU devices
  took TensorFlow over 15 minutes to make, the rest ran."""
  c = configs.load("lstm_longmem")
  section, field = key.split(".")
  setattr(c[section], field, value)
  with pytest.raises(UserError) as e:
    validate.config(c)
  assert str(e.value).startswith(message)


def test_the_last_32_bit_seed_is_accepted():
  c = configs.load("lstm_longmem")
  c.runtime.seed = 2**32 - 1
  validate.config(c)


@pytest.mark.parametrize("override,message", [
    ("--config.runtime.num_cpu_devices=100000",
     "runtime.num_cpu_devices=100000 is more than train.global_batch_size=32 "
     "(each replica needs at least one example); use at most 32."),
    ("--config.runtime.seed=-1", "runtime.seed=-1 is outside 0..4294967295"),
])
def test_the_command_line_refuses_them_before_tensorflow(tmp_path, override,
                                                         message):
  """Exit 2 at once, one line, nothing written."""
  workdir = tmp_path / "run"
  result = helpers.run_module(
      ["-m", "dist_keras.train", f"--workdir={workdir}",
       "--config.train.global_batch_size=32", override], timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith(f"dist_keras: error: {message}")
  assert result.stderr.count("\n") == 1
  assert not workdir.exists()
