"""The host's logical CPU devices: the CPU split into N before TensorFlow
starts, or, under runtime.strategy=auto, the devices it started with.

TensorFlow fixes its device list when its runtime initialises: the first
layer, tensor or `adapt()` (keras.io's scripts make some at import) does
it, after which no split can be asked for. `dist_keras.prepare_runtime(
num_cpu_devices=N)` asks for it first thing.
"""
import tensorflow as tf

from dist_keras import terminal
from dist_keras.configs import base
from dist_keras.errors import UserError


def local_devices(num_cpu_devices: int) -> list[str]:
  """All GPUs if there are any, else `num_cpu_devices` logical CPU devices."""
  # Physical, not logical: listing logical devices initialises TensorFlow,
  # after which the CPU can no longer be split.
  if tf.config.list_physical_devices("GPU"):
    return [d.name for d in tf.config.list_logical_devices("GPU")]
  split_cpu(num_cpu_devices)
  cpus = tf.config.list_logical_devices("CPU")
  return [d.name for d in cpus[:num_cpu_devices]]


def local_or_started(num_cpu_devices: int,
                     started_ok: bool = True) -> tuple[list[str], bool]:
  """(local_devices, False); or, where TensorFlow started before the CPU
  could be split (split_cpu refused) and `started_ok`, (the devices it
  has: its GPUs, else its logical CPUs, True)."""
  try:
    return local_devices(num_cpu_devices), False
  except UserError as e:
    if not started_ok or not isinstance(e.__cause__, RuntimeError):
      raise
  return [d.name for d in tf.config.list_logical_devices("GPU")
          or tf.config.list_logical_devices("CPU")], True


def auto_devices(num_cpu_devices: int) -> list[str]:
  """local_devices for runtime.strategy=auto: where TensorFlow started
  before fit (a script's layer or tensor at import) and the count is the
  default one, the devices it has, said in one line with how to get the
  split (auto is dist_keras' choice, and N replicas train what one device
  trains); a count the user chose is refused as under mirrored."""
  default = base.get_config().runtime.num_cpu_devices
  devices, started = local_or_started(num_cpu_devices,
                                      num_cpu_devices == default)
  if not started:
    return devices
  terminal.say(
      f"dist_keras: TensorFlow started before fit (a layer, tensor or "
      f"adapt() at import?) with {len(devices)} logical CPU device(s), so "
      f"runtime.strategy=auto trains on {len(devices)} replica(s), not "
      f"runtime.num_cpu_devices={num_cpu_devices}; for {num_cpu_devices}, "
      f"call {_PREPARE.format(n=num_cpu_devices)} before anything uses "
      "TensorFlow.")
  return devices


_PREPARE = "dist_keras.prepare_runtime(num_cpu_devices={n})"


def asked(num_cpu_devices: int) -> None:
  """split_cpu for a count the user set (fit's config): refused now where
  TensorFlow started with fewer, as under runtime.strategy=mirrored, not
  taken as auto's default (auto_devices). GPUs: the count does not apply."""
  if not tf.config.list_physical_devices("GPU"):
    split_cpu(num_cpu_devices)


def split_cpu(num_devices: int) -> None:
  """Splits the host CPU into `num_devices` logical devices (once per process).

  TensorFlow fixes the device list when its runtime initialises; after that
  a different split is impossible, so ask for it first thing. A process that
  already has at least `num_devices` logical CPUs is left as it is.
  """
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
        f"started with {have} logical CPU device(s) (a layer, tensor or "
        "adapt() made before fit starts it); call "
        f"{_PREPARE.format(n=num_devices)} at the top of the script, before "
        "anything uses TensorFlow, or set runtime.num_cpu_devices="
        f"{have}.") from e
