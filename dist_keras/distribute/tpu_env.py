"""The TPU runtime's environment, set before TensorFlow starts (no TF here).

TPU v5e, v5p and v6e (Colab's v5e-1 and v6e-1 runtimes, Cloud TPU VMs) run
TensorFlow only through the PJRT runtime: libtpu loaded as a pluggable
device. TensorFlow reads that choice from the environment when it is
imported, so it must be made first: PJRT_DEVICE=TPU,
NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=
the libtpu package's library (what Google's TensorFlow-on-TPU recipes, e.g.
keras-io's distributed_embedding_tf, set). Without them TensorFlow finds no
TPU kernels ("ConfigureDistributedTPU has no kernel, only CPU registered",
tensorflow#96203). The older chips (v2-v4, /dev/accelN) use TensorFlow's
classic TPU runtime, which these variables would break: nothing is set there.

`prepare` is the one place that sets them; the command line calls it before
importing TensorFlow, `dist_keras.fit` before its first TensorFlow import,
and a notebook through `dist_keras.prepare_runtime()` in its first cell.
"""
import importlib
import importlib.util
import os
import sys
from typing import Callable, Mapping, MutableMapping

from dist_keras import terminal

# TPU chips' device nodes on a TPU VM: /dev/accelN for v2-v4, VFIO IOMMU
# groups /dev/vfio/N for v5e, v5p and v6e. Not /dev/accel/accelN (Intel and
# AMD NPUs) nor /dev/vfio/vfio (VFIO's control node, on any VFIO host).
CLASSIC_DEVICE = "/dev/accel0"
PJRT_DEVICES = tuple(f"/dev/vfio/{i}" for i in range(8))
DEVICE_PATHS = (CLASSIC_DEVICE,) + PJRT_DEVICES
# Variables that configure a TPU for this process.
ENV_VARS = (
    "TPU_NAME",  # TF's Cloud TPU client reads it: a TPU node's name/address.
    "COLAB_TPU_ADDR",  # Colab's TPU-node runtimes (before 2024).
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",  # GKE TPU nodes; TF's client reads it.
    "TPU_ACCELERATOR_TYPE",  # libtpu's topology variables, set by GKE on
    "TPU_WORKER_ID",  # TPU VM pods (and read by libtpu instead of asking
    "TPU_WORKER_HOSTNAMES",  # the GCE metadata server).
)
# TPU_ACCELERATOR_TYPE prefixes of the chips that need PJRT (v5litepod-1,
# v5p-8, v6e-1, ...).
PJRT_TYPES = ("v5", "v6")
PJRT_VARIABLES = ("PJRT_DEVICE", "NEXT_PLUGGABLE_DEVICE_USE_C_API",
                  "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


def detect(environ: Mapping[str, str],
           path_exists: Callable[[str], bool]) -> str | None:
  """Why a TPU may be attached to or configured for this process, or None.

  Pure (reads only its arguments), so tests can drive it. A non-None answer
  means "worth trying", not "works": the TensorFlow build may lack TPU
  support, or the TPU may be busy.
  """
  for path in DEVICE_PATHS:
    if path_exists(path):
      return f"{path} exists"
  for name in ENV_VARS:
    if environ.get(name):
      return f"{name} is set"
  return None


def needs_pjrt(environ: Mapping[str, str],
               path_exists: Callable[[str], bool]) -> bool:
  """Whether this host's TPU is one that TensorFlow drives through PJRT."""
  if path_exists(CLASSIC_DEVICE):
    return False
  chip = environ.get("TPU_ACCELERATOR_TYPE", "")
  return chip.startswith(PJRT_TYPES) or any(map(path_exists, PJRT_DEVICES))


def prepare(strategy: str = "auto", tpu: str = "local",
            environ: MutableMapping[str, str] | None = None,
            path_exists: Callable[[str], bool] = os.path.exists,
            find_libtpu: Callable[[], str | None] | None = None) -> dict:
  """Sets the PJRT variables a TPU needs, if one is wanted and here.

  Wanted: runtime.strategy 'tpu', or 'auto' on a host that shows a TPU;
  on this host (runtime.tpu 'local': a TPU node is classic); of a PJRT
  chip (needs_pjrt); with the libtpu package installed. A variable the user
  set is never changed.

  Args:
    strategy, tpu: runtime.strategy and runtime.tpu.
    environ: the environment to set (default os.environ).
    path_exists: where to look for TPU devices (default os.path.exists).
    find_libtpu: `() -> libtpu.so's path or None` (default: the libtpu
      package's get_library_path()).

  Returns:
    {variable: value} of the variables set now ({} if none).
  """
  environ = os.environ if environ is None else environ
  find_libtpu = find_libtpu or libtpu_library
  wanted = strategy == "tpu" or (strategy == "auto" and detect(
      environ, path_exists) is not None)
  if not wanted or tpu != "local" or not needs_pjrt(environ, path_exists):
    return {}
  library = find_libtpu()
  if not library:
    return {}  # tpu.get_strategy says "this TensorFlow has no libtpu".
  values = {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": library}
  set_now = {k: v for k, v in values.items() if k not in environ}
  environ.update(set_now)
  return set_now


def prepare_and_report(strategy: str, tpu: str, verbose: bool) -> dict:
  """`prepare`, saying on stderr when it came too late (TensorFlow already
  imported) or, with `verbose`, what it set. Returns what it set."""
  late = "tensorflow" in sys.modules
  set_now = prepare(strategy, tpu)
  line = describe(set_now) if verbose else None
  if set_now and late:
    line = ("dist_keras: warning: TensorFlow was imported before the TPU "
            "runtime was set up, so it will not see the TPU; call "
            "dist_keras.prepare_runtime() before importing tensorflow "
            "(restart the runtime first).")
  if line:
    terminal.say(line, err=True)
  return set_now


def libtpu_library() -> str | None:
  """The libtpu package's libtpu.so, or None without the package."""
  if importlib.util.find_spec("libtpu") is None:
    return None
  libtpu = importlib.import_module("libtpu")
  return libtpu.get_library_path()


def describe(set_now: dict) -> str:
  """One line for --verbose: what prepare set."""
  if not set_now:
    return "dist_keras: TPU runtime: no variable set"
  return "dist_keras: TPU runtime (PJRT): set " + ", ".join(
      f"{k}={v}" for k, v in set_now.items())
