"""The TPU branch: detection, resolver arguments, start-up order, failures.

No TPU here: TensorFlow's resolver, connect, initialise and TPUStrategy are
replaced by recording fakes, except in the tests marked "real", which run
the real TensorFlow calls on this TPU-less host to check they fail fast.
"""
import socket
import time

import pytest
import tensorflow as tf

import helpers
from dist_keras.distribute import strategies
from dist_keras.distribute import tfconfig
from dist_keras.distribute import tpus
from dist_keras.errors import UserError

NO_DEVICES = lambda path: False  # pylint: disable=unnecessary-lambda-assignment


def _devices(*present):
  return lambda path: path in present


def _runtime(**overrides):
  c = helpers.tiny_config().runtime
  for key, value in overrides.items():
    setattr(c, key, value)
  return c


class FakeTF:
  """Records the TPU calls, in order; `fail_at` makes one of them raise.
  A TensorFlow with TPU kernels: it can load libtpu (has_tpu_runtime)."""

  def __init__(self, monkeypatch, master="", fail_at=None, error=None):
    self.calls, self.resolver_args, self.probes = [], [], []
    self.fail_at = fail_at
    self.error = error or tf.errors.NotFoundError(
        None, None, "TPUs not found in the cluster.\nsecond line")
    fake = self

    class Resolver:
      def __init__(self, **kwargs):
        fake.resolver_args.append(kwargs)
        fake.socket_timeout = socket.getdefaulttimeout()
        fake.record("resolver")

      def master(self):
        return master

    class Strategy:
      def __init__(self, resolver):
        assert isinstance(resolver, Resolver)
        fake.record("strategy")

    self.Strategy = Strategy
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                        Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                        lambda r: self.record("connect"))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                        lambda r: self.record("initialize"))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", Strategy)
    monkeypatch.setattr(tpus, "probe", self._probe)
    monkeypatch.setattr(tpus, "has_tpu_runtime", lambda environ: True)

  def record(self, call):
    if call == self.fail_at:
      raise self.error
    self.calls.append(call)

  def _probe(self, host, port, timeout):
    self.probes.append((host, port, timeout))
    if self.fail_at == "probe":
      raise ConnectionRefusedError(111, "Connection refused")


# --- Detection: where a TPU can exist ---------------------------------------

@pytest.mark.parametrize("environ,paths,found", [
    ({}, (), None),
    ({"CUDA_VISIBLE_DEVICES": "0", "HOME": "/root"}, (), None),
    ({}, ("/dev/accel0",), "/dev/accel0 exists"),  # TPU v2-v4 VM.
    ({}, ("/dev/vfio/0",), "/dev/vfio/0 exists"),  # v5e, v5p, v6e VM.
    ({}, ("/dev/vfio/vfio", "/dev/vfio/3"), "/dev/vfio/3 exists"),
    ({}, ("/dev/vfio/vfio",), None),  # VFIO's control node: any VFIO host.
    ({}, ("/dev/accel/accel0",), None),  # An Intel/AMD NPU, not a TPU.
    ({"TPU_NAME": "my-tpu"}, (), "TPU_NAME is set"),
    ({"TPU_NAME": ""}, (), None),
    ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, (), "COLAB_TPU_ADDR is set"),
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, (),
     "TPU_ACCELERATOR_TYPE is set"),
    ({"TPU_WORKER_ID": "0"}, (), "TPU_WORKER_ID is set"),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, (), "TPU_WORKER_HOSTNAMES is set"),
    ({"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS": "grpc://10.0.0.2:8470"}, (),
     "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS is set"),
    ({"TPU_NAME": "x"}, ("/dev/accel0",), "/dev/accel0 exists"),
])
def test_detect(environ, paths, found):
  assert tpus.detect(environ, _devices(*paths)) == found


@pytest.mark.parametrize("name,possible,chosen", [
    ("auto", False, "mirrored"),
    ("auto", True, "tpu"),
    ("tpu", False, "tpu"),
    ("tpu", True, "tpu"),
    ("mirrored", True, "mirrored"),
    ("one_device", True, "one_device"),
])
def test_choose_tries_the_tpu_first_only_where_one_can_exist(name, possible,
                                                             chosen):
  assert tfconfig.choose(name, None, possible) == chosen


def test_a_cluster_tf_config_beats_a_possible_tpu():
  cluster = tfconfig.parse('{"cluster": {"worker": ["127.0.0.1:2000", '
                           '"127.0.0.1:2001"]}, "task": {"type": "worker", '
                           '"index": 0}}')
  assert tfconfig.choose("auto", cluster, True) == "multi_worker_mirrored"


# --- Start-up: resolver arguments and order --------------------------------

def test_local_tpu_vm_initialises_without_connecting(monkeypatch):
  fake = FakeTF(monkeypatch)
  s = strategies.get_strategy(_runtime(strategy="tpu"), environ={},
                            path_exists=_devices("/dev/accel0"))
  assert isinstance(s, fake.Strategy)
  assert fake.resolver_args == [{"tpu": "local"}]
  # TensorFlow's connect_to_cluster returns at once for a local master.
  assert fake.calls == ["resolver", "initialize", "strategy"]
  assert fake.probes == []


@pytest.mark.parametrize("name,master,host", [
    ("my-tpu", "grpc://10.1.2.3:8470", "10.1.2.3"),
    ("grpc://10.0.0.5:8470", "grpc://10.0.0.5:8470", "10.0.0.5"),
])
def test_tpu_node_is_probed_then_connected_then_initialised(
    monkeypatch, name, master, host):
  fake = FakeTF(monkeypatch, master=master)
  s = strategies.get_strategy(_runtime(strategy="tpu", tpu=name), environ={},
                            path_exists=NO_DEVICES)
  assert isinstance(s, fake.Strategy)
  assert fake.resolver_args == [{"tpu": name}]
  assert fake.probes == [(host, 8470, tpus.PROBE_SECONDS)]
  assert fake.calls == ["resolver", "connect", "initialize", "strategy"]


def test_the_resolver_runs_with_a_socket_timeout(monkeypatch):
  # A TPU name's metadata look-up has no timeout of its own.
  fake = FakeTF(monkeypatch, master="grpc://10.1.2.3:8470")
  before = socket.getdefaulttimeout()
  strategies.get_strategy(_runtime(strategy="tpu", tpu="my-tpu"), environ={},
                        path_exists=NO_DEVICES)
  assert fake.socket_timeout == tpus.PROBE_SECONDS
  assert socket.getdefaulttimeout() == before


def test_the_old_colab_form_is_refused_before_any_tf_call(monkeypatch):
  fake = FakeTF(monkeypatch)
  for name in ("tpu", "auto"):
    with pytest.raises(UserError) as e:
      strategies.get_strategy(_runtime(strategy=name, tpu=""), environ={},
                            path_exists=_devices("/dev/accel0"))
    assert str(e.value).startswith("runtime.tpu='' is the old Colab TPU-node")
    assert "runtime.tpu=local" in str(e.value)
  assert fake.calls == []


# --- Failures ---------------------------------------------------------------

def test_no_tpu_device_fails_without_calling_tensorflow(monkeypatch):
  fake = FakeTF(monkeypatch)
  with pytest.raises(UserError) as e:
    strategies.get_strategy(_runtime(strategy="tpu"), environ={},
                          path_exists=NO_DEVICES)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith("runtime.strategy='tpu' but no TPU was found "
                            "(runtime.tpu='local' is this host's TPU")
  assert "Runtime > Change runtime type > TPU" in message
  assert "pip install 'tensorflow-tpu<2.21,>=2.19' 'libtpu<0.0.32'" in message
  assert "dist-keras[" not in message and "runtime.strategy=auto" in message
  assert fake.calls == []


@pytest.mark.parametrize("fail_at", ["resolver", "initialize", "strategy"])
def test_a_failed_start_says_what_was_tried(monkeypatch, fail_at):
  fake = FakeTF(monkeypatch, fail_at=fail_at)
  with pytest.raises(UserError) as e:
    strategies.get_strategy(_runtime(strategy="tpu"), environ={},
                          path_exists=_devices("/dev/vfio/0"))
  message = str(e.value)
  assert "\n" not in message
  assert ("did not start (tried TPUClusterResolver(tpu='local'): "
          "NotFoundError: TPUs not found in the cluster.); ") in message
  assert "strategy" not in fake.calls


# libtpu's words for a chip another process holds (v5e/v6e, PJRT).
BUSY = tf.errors.InternalError(
    None, None, "TPU initialization failed: open(/dev/vfio/0): Device or "
    "resource busy: Device or resource busy; Couldn't open iommu group "
    "/dev/vfio/0\n(more lines)")


@pytest.mark.parametrize("shown,here,devices", [
    ({"path_exists": _devices("/dev/vfio/0")}, "/dev/vfio/0 exists",
     "/dev/vfio/*"),
    ({"path_exists": _devices("/dev/accel0")}, "/dev/accel0 exists",
     "/dev/accel*"),
    ({"environ": {"TPU_ACCELERATOR_TYPE": "v6e-1"}},
     "TPU_ACCELERATOR_TYPE is set", "/dev/vfio/*"),
])
def test_a_tpu_here_with_libtpu_that_does_not_start_names_this_hosts_fixes(
    monkeypatch, shown, here, devices):
  # A TPU shows and this TensorFlow has libtpu (FakeTF), yet initialising
  # fails: another runtime type would not help; a process holding the chip
  # or a libtpu that does not match this TensorFlow is what to look at.
  fake = FakeTF(monkeypatch, fail_at="initialize", error=BUSY)
  with pytest.raises(tpus.NoTpuError) as e:
    strategies.get_strategy(_runtime(strategy="tpu"),
                            **{"environ": {}, "path_exists": NO_DEVICES,
                               **shown})
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(
      f"runtime.strategy='tpu': a TPU is here ({here}) and this TensorFlow "
      "has libtpu, but the TPU did not start (tried TPUClusterResolver("
      "tpu='local'): InternalError: TPU initialization failed: "
      "open(/dev/vfio/0): Device or resource busy: ")
  assert "(more lines)" not in message  # TensorFlow's first line only.
  assert (f"another process may hold it (a notebook kernel, an earlier run: "
          f"`sudo lsof -w {devices}` names it; stop it), or this TensorFlow "
          "and libtpu do not match (pip install 'tensorflow-tpu<2.21,>=2.19' "
          "'libtpu<0.0.32'); or use runtime.strategy=auto.") in message
  assert "Change runtime type" not in message and "no TPU was found" not in (
      message)
  assert e.value.tpu_here and e.value.fix.startswith("another process")
  assert fake.calls == ["resolver"]


@pytest.mark.parametrize("shown", [
    {"environ": {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}},
    {"environ": {}, "path_exists": _devices("/dev/vfio/0")}])
def test_a_required_tpu_this_tensorflow_cannot_drive_names_the_install(
    monkeypatch, shown):
  # The TPU is here (Colab's TPU runtime whose install failed, or
  # tensorflow-cpu on a TPU VM): changing the runtime type would not help.
  fake = FakeTF(monkeypatch)
  monkeypatch.setattr(tpus, "has_tpu_runtime", lambda environ: False)
  with pytest.raises(tpus.NoTpuError) as e:
    strategies.get_strategy(_runtime(strategy="tpu"),
                          **{"path_exists": NO_DEVICES, **shown})
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith("runtime.strategy='tpu': a TPU is here (")
  assert "but this TensorFlow has no libtpu to start it; pip install " in (
      message)
  assert "Change runtime type" not in message and "no TPU was found" not in (
      message)
  assert e.value.tpu_here and e.value.fix.startswith("pip install ")
  assert fake.calls == [] and fake.resolver_args == []


def test_an_unreachable_tpu_node_is_never_connected(monkeypatch):
  fake = FakeTF(monkeypatch, master="grpc://10.9.9.9:8470", fail_at="probe")
  with pytest.raises(UserError) as e:
    strategies.get_strategy(_runtime(strategy="tpu", tpu="grpc://10.9.9.9:8470"),
                          environ={}, path_exists=NO_DEVICES)
  assert ("(tried TPUClusterResolver(tpu='grpc://10.9.9.9:8470'): no answer "
          "in 3 s (ConnectionRefusedError") in str(e.value)
  assert "TPU node is READY" in str(e.value)
  assert fake.calls == ["resolver"]


def test_auto_falls_back_with_a_notice(monkeypatch, capsys):
  fake = FakeTF(monkeypatch, fail_at="initialize")
  s = strategies.get_strategy(
      _runtime(strategy="auto"),
      environ={"TPU_LIBRARY_PATH": "/opt/libtpu.so"},
      path_exists=_devices("/dev/accel0"))
  assert isinstance(s, tf.distribute.MirroredStrategy)
  assert s.num_replicas_in_sync == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert err.startswith("dist_keras: runtime.strategy=auto: a TPU may be here "
                        "(/dev/accel0 exists) but it did not start (tried ")
  assert err.endswith("using the CPUs/GPUs instead.\n")
  assert fake.calls == ["resolver"]


def test_auto_does_not_start_a_tpu_this_tensorflow_cannot_drive(
    monkeypatch, capsys):
  # Trying would start TensorFlow's runtime for nothing (tensorflow-cpu on a
  # TPU VM), fixing the CPU devices before the fallback splits them.
  fake = FakeTF(monkeypatch)
  monkeypatch.setattr(tpus, "has_tpu_runtime", lambda environ: False)
  s = strategies.get_strategy(_runtime(strategy="auto"), environ={},
                            path_exists=_devices("/dev/accel0"))
  assert isinstance(s, tf.distribute.MirroredStrategy)
  assert "this TensorFlow has no libtpu" in capsys.readouterr().err
  assert fake.calls == []


def test_auto_without_a_tpu_never_tries_one(monkeypatch, capsys):
  fake = FakeTF(monkeypatch)
  s = strategies.get_strategy(_runtime(strategy="auto"), environ={},
                            path_exists=NO_DEVICES)
  assert isinstance(s, tf.distribute.MirroredStrategy)
  assert fake.calls == [] and capsys.readouterr().err == ""


def test_tpu_strategy_display_name():
  assert strategies.display_name(
      tf.distribute.OneDeviceStrategy("/cpu:0")) == "OneDeviceStrategy"
  # TPUStrategy's class is TPUStrategyV2; users know the public name.
  fake = object.__new__(tf.distribute.TPUStrategy)
  assert strategies.display_name(fake) == "TPUStrategy"


# --- Real TensorFlow, no TPU: fast, clear, nothing written ------------------

def test_real_cli_without_a_tpu_fails_fast(tmp_path):
  workdir = tmp_path / "run"
  start = time.monotonic()
  result = helpers.run_module(
      ["-m", "dist_keras.train", "--config.runtime.strategy=tpu",
       f"--workdir={workdir}"], timeout=120)
  seconds = time.monotonic() - start
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.splitlines() if l.startswith("dist_keras")]
  assert len(lines) == 1 and lines[0].startswith(
      "dist_keras: error: runtime.strategy='tpu' but no TPU was found (")
  assert "Runtime > Change runtime type > TPU" in lines[0]
  assert not workdir.exists()
  # The whole command: Python + TensorFlow import (~3 s here) + the check.
  assert seconds < 30, seconds


def test_real_resolver_fails_fast_where_it_is_tried(tmp_path):
  """The real TPUClusterResolver('local') + initialize_tpu_system on a host
  with no TPU (as if one were detected), and auto's fallback after it."""
  code = (
      "import sys, time\n"
      "from dist_keras.configs import base\n"
      "from dist_keras.distribute import strategies\n"
      "c = base.get_config().runtime\n"
      "env = {'TPU_ACCELERATOR_TYPE': 'v2-8', 'TPU_LIBRARY_PATH': '/x.so'}\n"
      "start = time.monotonic()\n"
      "try:\n"
      "  c.strategy = 'tpu'\n"
      "  strategies.get_strategy(c, environ=env)\n"
      "except Exception as e:\n"
      "  print('ERROR', time.monotonic() - start, e)\n"
      "c.strategy = 'auto'\n"
      "s = strategies.get_strategy(c, environ=env)\n"
      "print('FALLBACK', strategies.display_name(s), s.num_replicas_in_sync)\n")
  result = helpers.run_module(["-c", code], timeout=120)
  assert result.returncode == 0, result.stderr
  error = [l for l in result.stdout.splitlines() if l.startswith("ERROR")][0]
  _, seconds, message = error.split(" ", 2)
  assert float(seconds) < 5
  assert ("(tried TPUClusterResolver(tpu='local'): NotFoundError: TPUs not "
          "found in the cluster.") in message
  # A TPU shows (the variable) and libtpu is here: this host's fixes.
  assert "`sudo lsof -w /dev/accel*` names it" in message
  # The failed start has started TensorFlow with 1 CPU device: auto falls
  # back to what is there instead of failing to split the CPU.
  assert "FALLBACK MirroredStrategy 1" in result.stdout
  assert "using the CPUs/GPUs instead." in result.stderr


def test_real_probe_of_a_closed_port_fails_fast(monkeypatch):
  (port,) = helpers.free_ports(1)  # Nothing listens there.
  start = time.monotonic()
  with pytest.raises(UserError, match="ConnectionRefusedError"):
    tpus.get_strategy(f"grpc://127.0.0.1:{port}", required=True, environ={})
  assert time.monotonic() - start < 5
