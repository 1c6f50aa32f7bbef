"""The strategy factory: names, devices, and its error messages."""
import pytest
import tensorflow as tf

import helpers
from dist_keras import strategy
from dist_keras.errors import UserError


def _runtime(**overrides):
  c = helpers.tiny_config().runtime
  for key, value in overrides.items():
    setattr(c, key, value)
  return c


def test_unknown_strategy_lists_the_valid_ones():
  with pytest.raises(UserError) as e:
    strategy.get_strategy(_runtime(strategy="horovod"))
  message = str(e.value)
  assert "runtime.strategy='horovod'" in message
  for name in ("auto", "mirrored", "one_device"):
    assert name in message
  assert "\n" not in message


@pytest.mark.parametrize("name", ["multi_worker_mirrored", "tpu"])
def test_not_yet_built_strategies_are_refused_clearly(name):
  with pytest.raises(UserError, match="not built yet"):
    strategy.get_strategy(_runtime(strategy=name))


def test_num_cpu_devices_must_be_positive():
  with pytest.raises(UserError, match="num_cpu_devices=0 must be >= 1"):
    strategy.get_strategy(_runtime(num_cpu_devices=0))


def test_more_devices_than_the_started_runtime_has_is_refused():
  with pytest.raises(UserError, match="already started with 2 logical CPU"):
    strategy.get_strategy(_runtime(num_cpu_devices=8))


@pytest.mark.parametrize("name", ["auto", "mirrored"])
def test_auto_and_mirrored_use_the_logical_cpus(name):
  s = strategy.get_strategy(_runtime(strategy=name))
  assert isinstance(s, tf.distribute.MirroredStrategy)
  assert s.num_replicas_in_sync == 2


def test_one_device():
  s = strategy.get_strategy(_runtime(strategy="one_device"))
  assert isinstance(s, tf.distribute.OneDeviceStrategy)
  assert s.num_replicas_in_sync == 1
