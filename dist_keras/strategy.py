"""The one place that turns `config.runtime` into a tf.distribute strategy.

Logical CPU devices must be configured before TensorFlow initialises its
runtime, so `get_strategy` is called before anything else touches devices.
"""
import tensorflow as tf

from dist_keras.errors import UserError

STRATEGIES = ("auto", "mirrored", "one_device", "multi_worker_mirrored", "tpu")
_NOT_YET = {
    "multi_worker_mirrored": "multi-worker training (TF_CONFIG) is not built "
                             "yet (issue #4)",
    "tpu": "TPUStrategy is not built yet (issue #7)",
}


def get_strategy(runtime_cfg) -> tf.distribute.Strategy:
  """Returns the strategy `runtime_cfg.strategy` names.

  Args:
    runtime_cfg: `config.runtime` (strategy, num_cpu_devices, tpu).

  Raises:
    UserError: an unknown or not yet supported strategy, or a bad device count.
  """
  name = runtime_cfg.strategy
  if name not in STRATEGIES:
    raise UserError(f"runtime.strategy={name!r} is not one of "
                    f"{', '.join(STRATEGIES)}; pick one of those.")
  if name in _NOT_YET:
    raise UserError(f"runtime.strategy={name!r}: {_NOT_YET[name]}; use "
                    "runtime.strategy=auto, mirrored or one_device for now.")
  devices = local_devices(runtime_cfg.num_cpu_devices)
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy(devices[0])
  # auto and mirrored: every local GPU, else the logical CPU devices.
  return tf.distribute.MirroredStrategy(devices)


def local_devices(num_cpu_devices: int) -> list[str]:
  """All GPUs if there are any, else `num_cpu_devices` logical CPU devices."""
  # Physical, not logical: listing logical devices initialises TensorFlow,
  # after which the CPU can no longer be split.
  if tf.config.list_physical_devices("GPU"):
    return [d.name for d in tf.config.list_logical_devices("GPU")]
  split_cpu(num_cpu_devices)
  cpus = tf.config.list_logical_devices("CPU")
  return [d.name for d in cpus[:num_cpu_devices]]


def split_cpu(num_devices: int) -> None:
  """Splits the host CPU into `num_devices` logical devices (once per process).

  TensorFlow fixes the device list when its runtime initialises; after that
  a different split is impossible, so ask for it first thing. A process that
  already has at least `num_devices` logical CPUs is left as it is.
  """
  if isinstance(num_devices, bool) or num_devices < 1:
    raise UserError(f"runtime.num_cpu_devices={num_devices!r} must be >= 1.")
  cpu = tf.config.list_physical_devices("CPU")[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current and len(current) >= num_devices:
    return
  if num_devices == 1 and not current:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    raise UserError(
        f"runtime.num_cpu_devices={num_devices} but TensorFlow already "
        f"started with {have} logical CPU device(s); set it before anything "
        "else uses TensorFlow (or start a new process).") from e
