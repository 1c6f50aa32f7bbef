"""Speed options on 2 logical CPU replicas: float16 with loss scaling and
16-bit gradient compression of the all-reduce (XLA: tests/training/test_xla.py)."""
import functools
import json
import os

import numpy as np
import pytest

import helpers
from dist_keras import errors
from dist_keras.training import steps
from dist_keras.training import actions, allreduce, divergence


def _one_sgd_step(strategy, c, scale=None):
  """(weights before, weights after, step output) of one SGD step of `c`."""
  with helpers.built(c, strategy) as run:
    model, optimizer = run.model, run.model.optimizer
    if scale is not None:
      optimizer.dynamic_scale.assign(scale)
    before = [w.numpy() for w in model.trainable_variables]
    step = steps.make_train_step(strategy, model, steps.StepOptions(
        allreduce_dtype=c.runtime.allreduce_dtype,
        bytes_per_pack=c.runtime.bytes_per_pack))
    out = step(iter(run.parts.train_ds))
    return (before, [w.numpy() for w in model.trainable_variables], out,
            optimizer)


def _sgd_config():
  c = helpers.tiny_config("cnn_shapes")
  c.train.optimizer, c.train.learning_rate = "sgd", 0.5
  return c


def test_float16_skips_an_overflowing_step_as_keras_does(mirrored):
  c = _sgd_config()
  c.train.precision = "float16"
  before, after, out, optimizer = _one_sgd_step(mirrored, c, scale=6e37)
  assert int(out["skipped"]) == 1
  assert not bool(out["finite_grads"])
  for b, a in zip(before, after):  # Nothing applied, and, as under Keras'
    np.testing.assert_array_equal(b, a)  # fit, the optimizer's counter
  assert int(optimizer.iterations.numpy()) == 0  # (its schedule's) waits;
  assert float(optimizer.dynamic_scale.numpy()) == pytest.approx(3e37)
  # the loop counts the batch (checkpoints hold the loop's step).


def test_float16_applies_a_finite_step_like_float32(mirrored):
  """Loss scaling is invisible when nothing overflows: the update matches
  float32's to float16 precision."""
  c = _sgd_config()
  _, f32, _, _ = _one_sgd_step(mirrored, c)
  c.train.precision = "float16"
  before, f16, out, _ = _one_sgd_step(mirrored, c)
  assert int(out["skipped"]) == 0
  moved = max(np.abs(b - a).max() for b, a in zip(before, f32))
  assert moved > 1e-3
  for a, b in zip(f32, f16):
    np.testing.assert_allclose(a, b, atol=0.02 * moved)


def test_float16_run_logs_the_loss_scale_and_skipped_steps(tmp_path,
                                                           mirrored):
  c = helpers.tiny_config()
  c.train.precision = "float16"
  with helpers.trainer(c, str(tmp_path), mirrored) as trainer:
    summary = trainer.run()
  assert trainer.model.layers[-1].compute_dtype == "float16"
  assert summary["steps"] == 8 and np.isfinite(summary["train_loss"])
  assert summary["skipped_steps"] == 0
  tags = helpers.scalar_tags(str(tmp_path))
  assert [v for _, v in tags["train/loss_scale"]] == [2.0**15, 2.0**15]


def test_a_skipped_float16_step_is_not_divergence(tmp_path, mirrored):
  c = helpers.tiny_config()
  c.train.precision = "float16"
  with helpers.trainer(c, str(tmp_path), mirrored) as trainer:
    overflow = {"loss": np.float32(1.0), "finite_grads": False,
                "skipped": 1}
    run = actions.RunState(trainer.settings.schedule, step=1)
    check = functools.partial(divergence.check, run,
                              optimizer=trainer.model.optimizer,
                              checkpoints=trainer.parts.checkpoints)
    check({k: _np(v) for k, v in overflow.items()})
    assert run.skipped_steps == 1
    trainer.model.optimizer.dynamic_scale.assign(0.5)  # Overflows even unscaled.
    run.step = 2
    with pytest.raises(errors.Diverged, match="at step 2"):
      check({k: _np(v) for k, v in overflow.items()})


def _np(value):
  """Like a step output: something with .numpy()."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.constant(value)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_compressed_allreduce_sums_in_16_bits(mirrored, dtype):
  c = _sgd_config()
  before, exact, _, _ = _one_sgd_step(mirrored, c)
  c.runtime.allreduce_dtype = dtype
  _, compressed, _, _ = _one_sgd_step(mirrored, c)
  updates = [a - b for a, b in zip(exact, before)]
  moved = [a - b for a, b in zip(compressed, before)]
  # The update is the float32 one to 16-bit precision (bfloat16: 8 bits of
  # mantissa, float16: 11), and not bit for bit: the cast happened.
  rtol = {"bfloat16": 2**-7, "float16": 2**-10}[dtype]
  for s, m in zip(updates, moved):
    np.testing.assert_allclose(m, s, rtol=rtol, atol=rtol * np.abs(s).max())
  assert any(not np.array_equal(s, m) for s, m in zip(updates, moved))


def test_one_replica_makes_no_all_reduce(monkeypatch):
  """One replica sums with no one: its step calls no all-reduce (TF's
  all-reduce of one replica is not free: docs/performance.md), so compressing it
  changes nothing, bit for bit (under Mirrored it does: above)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  calls = []
  real = allreduce.all_reduce_gradients
  monkeypatch.setattr(allreduce, "all_reduce_gradients",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  c = _sgd_config()
  before, exact, _, _ = _one_sgd_step(one_device, c)
  c.runtime.allreduce_dtype = "bfloat16"
  _, compressed, _, _ = _one_sgd_step(one_device, c)
  assert calls == []
  assert any(not np.array_equal(a, b) for a, b in zip(exact, before))
  for a, b in zip(exact, compressed):
    np.testing.assert_array_equal(a, b)


def test_packing_splits_the_collective_and_keeps_the_sums():
  """Under TF's collective all-reduce (MultiWorkerMirroredStrategy's) four
  1 KB gradients go as one collective unpacked (0), one per gradient in
  512-byte packs, two in 2 KB packs: packing took effect, sums unchanged."""
  result = helpers.run_module([os.path.join("tests", "scripts",
                                            "pack_ops.py"), "0", "512", "2048"])
  assert result.returncode == 0, result.stderr[-2000:]
  out = json.loads(result.stdout)
  assert {size: out[size]["packs"] for size in out} == {
      "0": 1, "512": 4, "2048": 2}
  for size in out:
    assert out[size]["sums"] == [0.0, 2.0, 4.0, 6.0]  # 2 replicas x i.


def test_packed_allreduce_trains_the_same_weights(mirrored):
  """runtime.bytes_per_pack on Mirrored over CPUs: TF reduces to one device
  there and does not pack (the test above shows packing where it applies);
  the option must still reach the all-reduce and change nothing."""
  c = _sgd_config()
  _, whole, _, _ = _one_sgd_step(mirrored, c)
  c.runtime.bytes_per_pack = 1024
  _, packed, _, _ = _one_sgd_step(mirrored, c)
  for a, b in zip(whole, packed):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_compressed_allreduce_halves_the_gradient_bytes(mirrored):
  c = _sgd_config()
  with helpers.built(c, mirrored) as run:
    variables = run.model.trainable_variables
    full = allreduce.gradient_bytes(variables)
    assert allreduce.gradient_bytes(variables, "bfloat16") * 2 == full


