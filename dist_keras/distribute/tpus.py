"""TPUStrategy: finding a TPU, starting it, and failing fast without one.

`runtime.tpu` names the TPU:
  * 'local' (default): the TPU attached to this host, i.e. a TPU VM: Colab's
    TPU runtimes (TPU VMs since 2024) and Cloud TPU VMs.
    `TPUClusterResolver(tpu='local')`, then `initialize_tpu_system`; no
    `experimental_connect_to_cluster`, which TensorFlow skips for a local
    master anyway (tensorflow/python/eager/remote.py).
  * a TPU name or 'grpc://HOST:PORT': a TPU node, reached over the network;
    connected with `experimental_connect_to_cluster` before initialising.
`runtime.tpu=''` is refused: it is the old Colab TPU-node form, and on a TPU
VM `TPUClusterResolver(tpu='')` raises "Please provide a TPU Name to connect
to" (googlecolab/colabtools#4699).

Nothing here waits on a TPU that is not there. TensorFlow's own attempts can:
connecting to a grpc:// address that refuses retries for minutes, and the
GCE metadata look-up of a TPU name has no timeout. So a local TPU is tried
only when the host shows one (`detect`), a TPU node only once its address
answers within PROBE_SECONDS.
"""
import contextlib
import importlib.util
import os
import socket
from typing import Mapping
from urllib import parse

import tensorflow as tf

from dist_keras.distribute.tpu_env import detect, needs_pjrt
from dist_keras import errors, installation, terminal
from dist_keras.errors import UserError

LOCAL = "local"
PROBE_SECONDS = 3.0
_HINTS = {
    LOCAL: "on Colab: Runtime > Change runtime type > TPU; on a Cloud TPU VM: "
           f"{installation.install('tpu')}",
    "node": "check that the TPU node is READY and reachable from here (a "
            "name resolves only on a GCE VM in its project; else pass "
            "grpc://HOST:8470)",
}


def has_tpu_runtime(environ: Mapping[str, str]) -> bool:
  """Whether this TensorFlow can load libtpu (the `libtpu` package that
  tensorflow-tpu depends on, or TPU_LIBRARY_PATH)."""
  return bool(environ.get("TPU_LIBRARY_PATH")
              or importlib.util.find_spec("libtpu"))


def get_strategy(tpu: str, required: bool, environ=None,
                 path_exists=os.path.exists):
  """A TPUStrategy on `tpu` (runtime.tpu), or None when auto falls back.

  Args:
    tpu: 'local', a TPU name or 'grpc://HOST:PORT'.
    required: runtime.strategy=tpu (True: failing is an error) or auto
      (False: a notice on stderr, and None).
    environ: where to look for TPU variables (default os.environ).
    path_exists: where to look for TPU devices (default os.path.exists).

  Raises:
    UserError: `tpu` is '' (always); NoTpuError (a UserError): no TPU
      started and `required`.
  """
  environ = os.environ if environ is None else environ
  check_name(tpu)
  here = detect(environ, path_exists) if tpu == LOCAL else None
  no_runtime = bool(here) and not has_tpu_runtime(environ)
  try:
    if no_runtime:
      # Trying would start TensorFlow's runtime (fixing the CPU devices
      # auto's fallback needs) only to fail: this build has no TPU kernels.
      raise _NoTpu(f"this TensorFlow has no libtpu ({installation.install('tpu')})")
    return connect(tpu, environ, path_exists)
  except _NoTpu as e:
    if required:
      raise required_error(tpu, here, no_runtime, e,
                           needs_pjrt(environ, path_exists)) from e
    terminal.say(f"dist_keras: runtime.strategy=auto: a TPU may be here "
                 f"({detect(environ, path_exists)}) but it did not start "
                 f"({e}); using the CPUs/GPUs instead.", err=True)
    return None


def required_error(tpu: str, here: str | None, no_runtime: bool,
                   error: Exception, pjrt: bool) -> "NoTpuError":
  """runtime.strategy=tpu's one line when no TPU started, chosen by what
  this host shows, so the fix offered is one that can help here.

  Args:
    tpu: runtime.tpu.
    here: `detect`'s finding for runtime.tpu='local' (None: no TPU shows,
      or a TPU node).
    no_runtime: this TensorFlow cannot load libtpu (`has_tpu_runtime`).
    error: what was tried and why it failed.
    pjrt: the TPU shown is a PJRT chip (`needs_pjrt`): its device nodes
      are /dev/vfio/N, a classic one's /dev/accelN.
  """
  if not here:  # Another runtime type (Colab) or the TPU node's state.
    return NoTpuError(f"no TPU was found ({error})",
                      _HINTS[LOCAL if tpu == LOCAL else "node"])
  if no_runtime:  # The fix is the install, not another runtime type.
    return NoTpuError(f"a TPU is here ({here}) but this TensorFlow has no "
                      "libtpu to start it", installation.install("tpu"),
                      tpu_here=True)
  # The TPU and libtpu are both here: libtpu opens the chip's device
  # nodes exclusively, so another process holding them fails the start
  # (libtpu itself suggests lsof), and so does a libtpu built for another
  # TensorFlow.
  devices = "/dev/vfio/*" if pjrt else "/dev/accel*"
  return NoTpuError(
      f"a TPU is here ({here}) and this TensorFlow has libtpu, but the TPU "
      f"did not start ({error})",
      f"another process may hold it (a notebook kernel, an earlier run: "
      f"`sudo lsof -w {devices}` names it; stop it), or this TensorFlow and "
      f"libtpu do not match ({installation.install('tpu')})", tpu_here=True)


def check_name(tpu: str) -> None:
  """Refuses `runtime.tpu` values TPUClusterResolver cannot take."""
  if not tpu:
    raise UserError(
        "runtime.tpu='' is the old Colab TPU-node form (TPUClusterResolver("
        "tpu='') fails on TPU VMs); use runtime.tpu=local on Colab and Cloud "
        "TPU VMs, or a TPU name / grpc://HOST:8470 for a TPU node.")


def connect(tpu: str, environ, path_exists) -> tf.distribute.Strategy:
  """Resolver -> (connect, for a TPU node) -> initialise -> TPUStrategy.

  Raises:
    _NoTpu: with what was tried and why it failed.
  """
  if tpu == LOCAL and detect(environ, path_exists) is None:
    raise _NoTpu("runtime.tpu='local' is this host's TPU, and it shows none: "
                 "no /dev/accel0 or /dev/vfio/N device, no TPU_NAME or TPU_* "
                 "variable")
  tried = f"TPUClusterResolver(tpu={tpu!r})"
  try:
    with _socket_timeout(PROBE_SECONDS):
      # For a TPU name, TensorFlow asks the GCE metadata server and the
      # Cloud TPU API here, with no timeout of its own.
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
      master = "" if tpu == LOCAL else resolver.master()
    if tpu != LOCAL:
      tried += f" -> {master}" if master != tpu else ""
      _check_reachable(master)
      tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  except _NoTpu as e:
    raise _NoTpu(f"tried {tried}: {e}") from e
  except (tf.errors.OpError, ValueError, RuntimeError, OSError,
          ImportError) as e:
    raise _NoTpu(f"tried {tried}: {type(e).__name__}: "
                 f"{errors.first_line(e)}") from e


class _NoTpu(Exception):
  """No TPU started; the message says what was tried and why it failed."""


class NoTpuError(UserError):
  """runtime.strategy=tpu and no TPU started. `cause`: what was tried and
  why it failed; `fix`: what to do on this host; `tpu_here`: the host shows
  a TPU (so the fix is on this host, not another runtime type). A notebook
  words its own line from these (its switch is not runtime.strategy)."""

  def __init__(self, cause: str, fix: str, tpu_here: bool = False):
    self.cause, self.fix, self.tpu_here = cause, fix, tpu_here
    super().__init__(f"runtime.strategy='tpu'{': ' if tpu_here else ' but '}"
                     f"{cause}; {fix}; or use runtime.strategy=auto.")


@contextlib.contextmanager
def _socket_timeout(seconds: float):
  """Bounds blocking socket calls made without a timeout (urllib's, the
  Cloud TPU client's) while the block runs; nothing else runs meanwhile."""
  previous = socket.getdefaulttimeout()
  socket.setdefaulttimeout(seconds)
  try:
    yield
  finally:
    socket.setdefaulttimeout(previous)


def _check_reachable(master: str) -> None:
  """Raises _NoTpu unless `master` (grpc://HOST:PORT) accepts a connection.

  experimental_connect_to_cluster retries a refused address for minutes.
  """
  address = parse.urlsplit(master if "://" in master else f"grpc://{master}")
  if not address.hostname:
    raise _NoTpu(f"no address in {master!r}")
  try:
    probe(address.hostname, address.port or 8470, PROBE_SECONDS)
  except OSError as e:
    raise _NoTpu(f"no answer in {PROBE_SECONDS:g} s "
                 f"({type(e).__name__}: {e})") from e


def probe(host: str, port: int, timeout: float) -> None:
  """Opens and closes a TCP connection to host:port; raises OSError."""
  with socket.create_connection((host, port), timeout=timeout):
    pass
