"""Batch-size rules for the learning rate (training/lr.py): Goyal et al.
2017's linear scaling and gradual warmup, exact across a resume and with
several steps per tf.function call."""
import glob
import os
import shutil

import keras
import numpy as np
import pytest

import helpers
from dist_keras import configs, models, validate
from dist_keras.training import lr
from dist_keras.errors import UserError


def _train_cfg(**overrides):
  c = configs.load("lstm_longmem")
  for key, value in overrides.items():
    setattr(c.train, key, value)
  return c.train


def test_warmup_ramps_from_the_base_rate_to_the_peak_then_stays():
  schedule = lr.warmup_to(0.003, 0.024, warmup_steps=50)
  values = {step: float(schedule(step)) for step in (0, 1, 25, 49, 50, 51,
                                                     10_000)}
  expected = {0: 0.003, 1: 0.00342, 25: 0.0135, 49: 0.02358, 50: 0.024,
              51: 0.024, 10_000: 0.024}
  assert values == pytest.approx(expected, rel=1e-6)
  assert values[50] == np.float32(0.024)  # Exactly the peak, no rounding.
  assert values[10_000] == np.float32(0.024)
  assert lr.warmup_to(0.003, 0.024, 0) == 0.024  # No ramp: a constant.


@pytest.mark.parametrize("rule,batch,expected_factor", [
    ("linear", 2048, 8.0),
    ("sqrt", 2048, 8 ** 0.5),
    ("none", 2048, 1.0),
    ("linear", 128, 0.5),
    ("linear", 256, 1.0),
])
def test_scaling_factor_and_peak(rule, batch, expected_factor):
  cfg = _train_cfg(lr_scaling=rule, global_batch_size=batch,
                   learning_rate=0.003)
  assert lr.factor(cfg) == pytest.approx(expected_factor)
  rate = lr.apply({"optimizer": models.make_optimizer(cfg)}, cfg)
  assert rate.peak == pytest.approx(0.003 * expected_factor)


def _optimizer(**train):
  cfg = _train_cfg(**train)
  return models.make_optimizer(cfg), cfg


def test_nothing_scaled_keeps_the_compiled_rate():
  optimizer, cfg = _optimizer()
  assert (cfg.lr_scaling, cfg.base_batch_size, cfg.warmup_steps) == (
      "none", 256, 0)
  rate = lr.apply({"optimizer": optimizer}, cfg)
  assert rate == lr.Rate(pytest.approx(0.003), pytest.approx(0.003), None)
  assert not isinstance(optimizer._learning_rate,  # pylint: disable=protected-access
                        keras.optimizers.schedules.LearningRateSchedule)


def test_the_schedule_is_keras_own_and_survives_serialization():
  """model.keras must load with Keras alone: the warmup is a built-in
  schedule (CosineDecay with alpha=1), not a dist_keras class."""
  optimizer, cfg = _optimizer(lr_scaling="sqrt", global_batch_size=1024,
                              warmup_steps=10)
  lr.apply({"optimizer": optimizer}, cfg)
  config = keras.optimizers.serialize(optimizer)
  assert "dist_keras" not in str(config)
  restored = keras.optimizers.deserialize(config)
  schedule = restored._learning_rate  # pylint: disable=protected-access
  assert isinstance(schedule, keras.optimizers.schedules.CosineDecay)
  assert float(schedule(10)) == pytest.approx(0.006)
  assert float(schedule(0)) == pytest.approx(0.003)


def test_scaling_a_compiled_schedule_is_refused():
  cfg = _train_cfg(lr_scaling="linear", global_batch_size=512)
  optimizer = keras.optimizers.SGD(
      keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5))
  with pytest.raises(UserError, match="compiled optimizer's is a schedule"):
    lr.apply({"optimizer": optimizer}, cfg)
  unscaled = lr.apply({"optimizer": optimizer}, _train_cfg())
  assert unscaled.base is None  # Kept.


def test_scaling_a_model_that_steps_other_optimizers_is_refused(tmp_path):
  """A GAN's own step applies d_optimizer and g_optimizer; the scaling
  changed only the compiled optimizer, which it never steps, silently."""
  import parity_task  # pylint: disable=g-import-not-at-top
  import dist_keras  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError) as e:
    dist_keras.fit(parity_task.gan, parity_task.images_dataset_fn,
                   workdir=str(tmp_path / "w"), strategy="one_device",
                   config={"train.global_batch_size": parity_task.GLOBAL_BATCH,
                           "train.steps": 2, "train.lr_scaling": "linear"})
  assert str(e.value) == (
      "train.lr_scaling='linear' scales the compiled optimizer's learning "
      "rate, but the model also holds d_optimizer, g_optimizer, which it "
      "would leave as they are; scale their rates in model_fn, or set "
      "train.lr_scaling=none.")
  assert not (tmp_path / "w").exists()


def test_a_rate_the_checkpoint_sets_is_named_beside_this_runs():
  """A resume restores the optimizer's rate variable (Keras'
  BackupAndRestore keeps it too): a rate it changes is said, one agreed
  on is not, and a schedule (no variable) has nothing to say."""
  optimizer = keras.optimizers.Adam(0.001)
  rate = lr.apply({"optimizer": optimizer}, _train_cfg())
  assert rate.kept_line({"optimizer": optimizer}, "ckpt-4") is None
  optimizer.learning_rate.assign(0.01)  # As the restore of ckpt-4 does.
  assert rate.kept_line({"optimizer": optimizer}, "ckpt-4") == (
      "learning rate 0.01 (this run's: 0.001) kept from ckpt-4: a resumed "
      "run goes on with the optimizer state it saved, as under Keras' "
      "BackupAndRestore; pass a new workdir to train at this run's from "
      "step 0")
  scheduled = keras.optimizers.SGD(
      keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5))
  assert lr.apply({"optimizer": scheduled}, _train_cfg()).asked == {}


def test_a_resume_after_model_fns_rate_was_edited_says_which_trains(
    tmp_path, capsys):
  """A notebook's rerun with the rate edited in model_fn: the run goes on
  at the checkpoint's, which the resume says (it was silent)."""
  import parity_task  # pylint: disable=g-import-not-at-top

  def edited():
    model = parity_task.plain()  # SGD(0.05)
    model.optimizer.learning_rate = 0.01
    return model

  config = {"train.global_batch_size": parity_task.GLOBAL_BATCH,
            "train.steps": 2, "train.checkpoint_every": 2, "eval.every": 0,
            "log.calibration_steps": 0, "log.peak_tflops": 1.0}
  helpers.fit_fns(parity_task.plain, parity_task.dataset_fn,
                  tmp_path / "w", config)
  capsys.readouterr()
  result = helpers.fit_fns(edited, parity_task.dataset_fn, tmp_path / "w",
                           {**config, "train.steps": 4})
  out = capsys.readouterr().out
  assert "resumed from ckpt-2 at step 2" in out
  assert ("learning rate 0.05 (this run's: 0.01) kept from ckpt-2: a "
          "resumed run goes on") in out, out
  assert float(result.model.optimizer.learning_rate) == pytest.approx(0.05)
  assert "learning rate" not in out.split("resumed run goes on")[1]  # Once.


def test_the_start_line_says_the_rule():
  cfg = _train_cfg(lr_scaling="linear", global_batch_size=2048,
                   warmup_steps=50)
  assert lr.describe(cfg, 0.003) == (
      "learning rate 0.003 x 8 (linear, batch 2048 / 256) = 0.024, warmup "
      "50 steps from 0.003")


@pytest.mark.parametrize("overrides,message", [
    ({"lr_scaling": "cubic"}, "train.lr_scaling='cubic' is not one of none, "
     "linear, sqrt; pick one of those."),
    ({"base_batch_size": 0}, "train.base_batch_size=0 must be >= 1"),
    ({"warmup_steps": -1}, "train.warmup_steps=-1 must be >= 0."),
    ({"lr_scaling": "linear", "warmup_steps": 801},
     "train.warmup_steps=801 is more than train.steps=800; use at most 800."),
    ({"warmup_steps": 10}, "train.warmup_steps=10 does nothing with "
     "train.lr_scaling='none'"),
])
def test_bad_settings_are_one_line_user_errors(overrides, message):
  c = configs.load("lstm_longmem")
  for key, value in overrides.items():
    setattr(c.train, key, value)
  with pytest.raises(UserError) as error:
    validate.config(c)
  assert str(error.value).startswith(message)
  assert "\n" not in str(error.value)


def test_bad_rule_on_the_command_line_exits_2(tmp_path):
  result = helpers.run_module(["-m", "dist_keras.train",
                               f"--workdir={tmp_path / 'run'}",
                               "--config.train.lr_scaling=cubic"])
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip() == (
      "dist_keras: error: train.lr_scaling='cubic' is not one of none, "
      "linear, sqrt; pick one of those.")
  assert not os.path.exists(tmp_path / "run")


WARMUP = 6
# Linear x2 (batch 64 for 32), warmup over 6 steps: the rate of updates 1..8.
RATES = [0.003, 0.0035, 0.004, 0.0045, 0.005, 0.0055, 0.006, 0.006]


def _warmup_config(**train):
  c = helpers.tiny_config()
  c.train.global_batch_size, c.train.base_batch_size = 64, 32
  c.train.lr_scaling, c.train.warmup_steps = "linear", WARMUP
  c.train.log_every = 1
  c.eval.every = 0
  for key, value in train.items():
    setattr(c.train, key, value)
  return c


def _run(config, workdir, strategy):
  with helpers.trainer(config, str(workdir), strategy) as trainer:
    summary = trainer.run()
  return summary, [w.numpy() for w in trainer.model.weights]


def test_warmup_is_logged_and_exact_across_resume_and_steps_per_loop(
    tmp_path, mirrored, capsys):
  config = _warmup_config()
  config.log.progress = True
  summary, whole = _run(config, tmp_path / "whole", mirrored)
  assert ("learning rate 0.003 x 2 (linear, batch 64 / 32) = 0.006, warmup "
          "6 steps from 0.003") in capsys.readouterr().out
  assert summary["peak_learning_rate"] == pytest.approx(0.006)
  logged = dict(helpers.scalar_tags(str(tmp_path / "whole"))["learning_rate"])
  assert logged == pytest.approx(dict(zip(range(1, 9), RATES)), rel=1e-6)

  # A run killed after its step-4 checkpoint, mid-warmup, then rerun.
  cut = tmp_path / "cut" / "checkpoints"
  cut.mkdir(parents=True)
  for path in glob.glob(str(tmp_path / "whole" / "checkpoints" / "ckpt-4.*")):
    shutil.copy(path, cut)
  (cut / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
  _, resumed = _run(_warmup_config(), tmp_path / "cut", mirrored)
  after = dict(helpers.scalar_tags(str(tmp_path / "cut"))["learning_rate"])
  assert after == pytest.approx({s: logged[s] for s in (5, 6, 7, 8)},
                                rel=1e-6)

  # Four updates per call: each still reads its own step's rate.
  looped = _warmup_config(steps_per_loop=4, log_every=8, checkpoint_every=8)
  _, grouped = _run(looped, tmp_path / "loop", mirrored)
  for expected, got_resumed, got_grouped in zip(whole, resumed, grouped):
    np.testing.assert_allclose(got_resumed, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_grouped, expected, rtol=0, atol=1e-6)


def test_float16_logs_the_schedule_of_its_inner_optimizer(tmp_path, mirrored):
  """A LossScaleOptimizer wraps the scheduled one: the logged rate is still
  the rate each step used."""
  config = _warmup_config(precision="float16")
  _run(config, tmp_path, mirrored)
  logged = dict(helpers.scalar_tags(str(tmp_path))["learning_rate"])
  assert logged == pytest.approx(dict(zip(range(1, 9), RATES)), rel=1e-6)
