"""The strategy factory: names, devices, and its error messages."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils  # pylint: disable=g-direct-tensorflow-import

import helpers
from dist_keras import validate
from dist_keras.distribute import strategies
from dist_keras.distribute import tfconfig
from dist_keras.errors import UserError


def _runtime(**overrides):
  c = helpers.tiny_config().runtime
  for key, value in overrides.items():
    setattr(c, key, value)
  return c


def test_unknown_strategy_lists_the_valid_ones():
  c = helpers.tiny_config()
  c.runtime.strategy = "horovod"
  with pytest.raises(UserError) as e:
    validate.config(c)
  message = str(e.value)
  assert "runtime.strategy='horovod'" in message
  for name in ("auto", "mirrored", "one_device"):
    assert name in message
  assert "\n" not in message


def test_tpu_without_a_tpu_is_refused_clearly():
  # The TPU branch itself: tests/distribute/test_tpu.py.
  with pytest.raises(UserError, match="'tpu' but no TPU was found"):
    strategies.get_strategy(_runtime(strategy="tpu"), environ={},
                          path_exists=lambda path: False)


def _cluster(num_workers):
  return tfconfig.parse(json.dumps({
      "cluster": {"worker": [f"127.0.0.1:{2000 + i}"
                             for i in range(num_workers)]},
      "task": {"type": "worker", "index": 0}}))


@pytest.mark.parametrize("name,workers,chosen", [
    ("auto", None, "mirrored"),
    ("auto", 1, "mirrored"),
    ("auto", 2, "multi_worker_mirrored"),
    ("multi_worker_mirrored", 1, "multi_worker_mirrored"),
    ("multi_worker_mirrored", 3, "multi_worker_mirrored"),
    ("mirrored", None, "mirrored"),
    ("one_device", 1, "one_device"),
])
def test_choose_follows_the_name_and_tf_config(name, workers, chosen):
  cluster = None if workers is None else _cluster(workers)
  assert tfconfig.choose(name, cluster) == chosen


def test_multi_worker_without_tf_config_is_refused():
  with pytest.raises(UserError, match="needs TF_CONFIG naming the cluster"):
    tfconfig.choose("multi_worker_mirrored", None)


@pytest.mark.parametrize("name", ["mirrored", "one_device"])
def test_a_single_host_strategy_with_a_cluster_tf_config_is_refused(name):
  with pytest.raises(UserError) as e:
    tfconfig.choose(name, _cluster(2))
  assert "TF_CONFIG names 2 tasks" in str(e.value)
  assert f"runtime.strategy={name!r}" in str(e.value)


def test_a_bad_tf_config_is_refused_by_the_factory():
  with pytest.raises(UserError, match="TF_CONFIG is not valid JSON"):
    strategies.get_strategy(_runtime(), environ={"TF_CONFIG": "{nope"})


@pytest.mark.parametrize("key,value,message", [
    ("collective", "gloo", "runtime.collective='gloo' is not one of"),
    ("bytes_per_pack", -1, "runtime.bytes_per_pack=-1 must be >= 0"),
    ("timeout_seconds", -5.0, "runtime.timeout_seconds=-5.0 must be >= 0"),
])
def test_bad_communication_options_are_refused(key, value, message):
  c = helpers.tiny_config()
  setattr(c.runtime, key, value)
  with pytest.raises(UserError, match=message.replace("(", r"\(")):
    validate.config(c)


def test_communication_options_come_from_the_config():
  options = strategies.communication_options(_runtime(
      collective="ring", bytes_per_pack=1 << 20, timeout_seconds=30.0))
  assert options.bytes_per_pack == 1 << 20
  assert options.timeout_seconds == 30.0
  assert options.implementation == (
      tf.distribute.experimental.CommunicationImplementation.RING)
  assert strategies.communication_options(_runtime()).timeout_seconds is None


def test_num_cpu_devices_must_be_positive():
  c = helpers.tiny_config()
  c.runtime.num_cpu_devices = 0
  with pytest.raises(UserError, match="num_cpu_devices=0 must be >= 1"):
    validate.config(c)


def test_more_devices_than_the_started_runtime_has_is_refused():
  tf.config.list_logical_devices("CPU")  # Starts the runtime with 2.
  with pytest.raises(UserError, match="already started with 2 logical CPU"):
    strategies.get_strategy(_runtime(num_cpu_devices=8))


@pytest.mark.parametrize("name", ["auto", "mirrored"])
def test_auto_and_mirrored_use_the_logical_cpus(name):
  s = strategies.get_strategy(_runtime(strategy=name))
  assert isinstance(s, tf.distribute.MirroredStrategy)
  assert s.num_replicas_in_sync == 2


def test_one_device():
  s = strategies.get_strategy(_runtime(strategy="one_device"))
  assert isinstance(s, tf.distribute.OneDeviceStrategy)
  assert s.num_replicas_in_sync == 1


def _cluster_with_my_port(port: int) -> str:
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}",
                                            "127.0.0.1:1"]},
                     "task": {"type": "worker", "index": 0}})


def test_a_port_in_use_is_one_line_before_tensorflows_server(tmp_path):
  """It was TensorFlow's three gRPC error lines and exit 1."""
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    message = (f"TF_CONFIG gives this task (worker:0) 127.0.0.1:{port}, but "
               f"port {port} is in use on this machine")
    with pytest.raises(UserError, match=re.escape(message)):
      strategies.check_port_free(tfconfig.parse(_cluster_with_my_port(port)))
    result = helpers.run_module(
        ["-m", "dist_keras.train", f"--workdir={tmp_path / 'run'}"],
        env={"TF_CONFIG": _cluster_with_my_port(port)}, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith(f"dist_keras: error: {message}")
  assert result.stderr.count("\n") == 1
  # Free again (closed connections do not count): nothing to say.
  strategies.check_port_free(tfconfig.parse(_cluster_with_my_port(port)))


def test_cpu_devices_set_for_a_multi_worker_run_are_said_not_to_apply():
  """It was ignored without a word (one CPU device a worker). Not refused:
  tests/scripts/train_weights.py, as a user may, runs one config with
  runtime.num_cpu_devices=3 as Mirrored and as 3 workers."""
  assert strategies.cpu_devices_note(4) == (
      "dist_keras: runtime.num_cpu_devices=4 does not apply to a "
      "multi-worker run: each worker trains on its GPUs or one CPU device")
  assert strategies.cpu_devices_note(1) is None
  assert strategies.cpu_devices_note(2) is None  # The default.


# One started worker serves both tests below (a TensorFlow process and a
# strategy's start less): its stdout on /dev/full where there is one, it
# starts, says so on stderr, then sends itself SIGTERM.
_STARTED_THEN_SIGTERM = """
import os, signal, sys, time
from dist_keras.distribute import strategies, tfconfig
import helpers
strategies.multi_worker(helpers.tiny_config().runtime, tfconfig.from_env())
sys.stderr.write("started\\n")
sys.stderr.flush()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
sys.stderr.write("still running 10 s after SIGTERM\\n")
"""


@pytest.fixture(scope="module")
def started_worker(tmp_path_factory):
  """(result of _STARTED_THEN_SIGTERM's run, whether stdout was /dev/full)."""
  script = tmp_path_factory.mktemp("started") / "started.py"
  script.write_text(_STARTED_THEN_SIGTERM)
  full = os.path.exists("/dev/full")
  with open("/dev/full" if full else os.devnull, "w",
            encoding="utf-8") as stdout:
    result = subprocess.run(
        [sys.executable, str(script)], stdout=stdout, stderr=subprocess.PIPE,
        text=True, timeout=120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                 TF_CONFIG=helpers.one_worker_cluster(),
                 PYTHONPATH=f"{helpers.REPO}:{helpers.REPO}/tests"))
  return result, full


def test_a_started_worker_still_stops_on_sigterm(started_worker):
  """TensorFlow's collective runtime installs its own C++ SIGTERM handler,
  which only records the signal: a started worker (building its model, its
  peers gone) ran on after SIGTERM until SIGKILL."""
  result, _ = started_worker
  assert "started" in result.stderr, result.stderr[-2000:]
  assert "still running" not in result.stderr
  assert result.returncode == -15, result.stderr[-2000:]


def test_a_worker_whose_stdout_fails_still_starts(started_worker):
  """The line a worker says before its collective runtime waits for its
  peers goes through the guarded print too: with stdout on /dev/full it
  was OSError (No space left on device), exit 1, before the strategy."""
  result, full = started_worker
  if not full:
    pytest.skip("no /dev/full here")
  assert result.stderr.endswith("started\n"), result.stderr[-2000:]
  assert result.returncode == -15, result.stderr[-2000:]  # Not exit 1.


# A notebook's sweep, in one process (its collectives stay out of this
# one): Keras' own fit under a new MirroredStrategy, then dist_keras.fit
# under new ones, two models in a row, then Keras' fit and dist_keras' again.
# One process serves both tests below (it was one each: a TensorFlow
# process and a fit less).
_FITS_UNDER_NEW_STRATEGIES = """
import sys, tempfile
import tensorflow as tf
from dist_keras.distribute import cpus
cpus.split_cpu(2)
import dist_keras, user_task

def keras_fit():  # As Keras' docs: a new strategy, the global batch.
  with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = user_task.model_fn()
  model.fit(user_task.dataset_fn("train", tf.distribute.InputContext()),
            steps_per_epoch=4, epochs=1, verbose=0)
  print("keras fitted", flush=True)

def dist_keras_fit(model_fn, dataset_fn, **config):
  dist_keras.fit(model_fn, dataset_fn,
                 workdir=tempfile.mkdtemp(dir=sys.argv[1]),
                 strategy=tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                 config={"train.global_batch_size": 48, **config})
  print(f"dist_keras fitted {model_fn.__name__}", flush=True)

# The two in a row as the test had them (12 steps, the default
# calibration). With own_collective_keys off (TF 2.21) they met no clash
# here, nor at 4 steps: Keras' fit before or after them did.
clashed = {"train.steps": 12, "eval.every": 6}
keras_fit()
dist_keras_fit(user_task.model_fn, user_task.dataset_fn, **clashed)
dist_keras_fit(user_task.binary_model_fn, user_task.binary_dataset_fn,
               **clashed)
keras_fit()
dist_keras_fit(user_task.model_fn, user_task.dataset_fn, **{
    "train.steps": 4, "eval.every": 2, "log.calibration_steps": 0})
"""


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
  """(the lines _FITS_UNDER_NEW_STRATEGIES printed, its stderr)."""
  result = helpers.run_module(
      ["-c", _FITS_UNDER_NEW_STRATEGIES, str(tmp_path_factory.mktemp("fits"))],
      env={"PYTHONPATH": f"{helpers.REPO}:{helpers.REPO}/tests"}, timeout=300)
  # Not every line with "fitted": under load the default calibration may
  # print "all-reduce model not fitted: ..." (its timings too noisy).
  return [line for line in result.stdout.splitlines()
          if line.startswith(("keras fitted", "dist_keras fitted"))
          ], result.stderr


def test_fits_under_a_new_mirrored_strategy_each_do_not_share_collectives(
    fitted):
  """A sweep in one process: each fit under a new MirroredStrategy. Every
  strategy numbers its collectives from the same keys, and the runtime
  remembers what a key did: the second model's first step failed with
  "Collective instance 110 expected type 2 and data_type 3 but got type 0"."""
  lines, stderr = fitted
  assert lines[1:3] == ["dist_keras fitted model_fn",
                        "dist_keras fitted binary_model_fn"], stderr[-3000:]


def test_keras_fit_and_dist_keras_fit_under_new_strategies_mix(fitted):
  """A notebook: Keras' own fit under a new MirroredStrategy, then
  dist_keras.fit under another, and again. Both numbered their collectives
  from TensorFlow's start: dist_keras' first fit failed ("Collective
  instance 101 expected type 0 and data_type 1 but got type 2 and
  data_type 3 ... Restart your program to reset"), and so did every
  later multi-replica run of the process, Keras' included."""
  lines, stderr = fitted
  assert lines == ["keras fitted", "dist_keras fitted model_fn",
                   "dist_keras fitted binary_model_fn", "keras fitted",
                   "dist_keras fitted model_fn"], stderr[-3000:]


def test_a_strategy_new_to_dist_keras_gets_keys_of_its_own(monkeypatch):
  """The first strategy's instance keys start past TensorFlow's start (where
  Keras' fit under a new strategy numbers its own), the next past the
  first's (with room for the first to trace more); one Keras' fit used
  past its own; one seen before keeps its own."""
  monkeypatch.setattr(strategies, "_KEYS_SEEN", [])
  devices = ["/cpu:0", "/cpu:1"]
  first, second, used = (tf.distribute.MirroredStrategy(devices)
                         for _ in range(3))

  def starts(strategy):
    table = strategy.extended._collective_keys._instance_key_table  # pylint: disable=protected-access
    return {key for group in table.values() for key in group.values()}

  def trace_one(strategy):  # One collective: its keys move on by one.
    keys = strategy.extended._collective_keys  # pylint: disable=protected-access
    keys.get_instance_key(keys.get_group_key(strategy.extended.worker_devices),
                          strategy.extended.worker_devices[0])

  gap = strategies._KEY_GAP  # pylint: disable=protected-access
  strategies.own_collective_keys(first)
  assert starts(first) == {100 + gap}
  trace_one(first)
  strategies.own_collective_keys(second)
  assert starts(second) == {101 + 2 * gap}
  for _ in range(3):
    trace_one(used)
  strategies.own_collective_keys(used)
  assert starts(used) == {101 + 3 * gap}
  trace_one(first)
  strategies.own_collective_keys(first)  # Seen: trained under again.
  assert starts(first) == {100 + gap, 102 + gap}


@pytest.mark.parametrize("owner,name,line", [
    ("extended", "_collective_keys", "MirroredExtended has no "
     "_collective_keys (its collective keys)"),
    ("keys", "_instance_key_table", "CollectiveKeys has no "
     "_instance_key_table (its instance keys)"),
    ("module", "INSTANCE_KEY_START_NUMBER", "tensorflow.python.distribute."
     "cross_device_utils has no INSTANCE_KEY_START_NUMBER (the first "
     "instance key)"),
])
def test_a_tensorflow_without_the_private_key_table_is_named_in_one_line(
    monkeypatch, owner, name, line):
  """own_collective_keys writes TensorFlow's private table: a release that
  renames a part of it is one line naming that part, not an AttributeError
  at build (nor, for the strategy's keys, a silent skip)."""
  monkeypatch.setattr(strategies, "_KEYS_SEEN", [])
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  monkeypatch.delattr({
      "extended": strategy.extended,
      "keys": strategy.extended._collective_keys,  # pylint: disable=protected-access
      "module": cross_device_utils}[owner], name)
  with pytest.raises(RuntimeError) as raised:
    strategies.own_collective_keys(strategy)
  assert str(raised.value) == (
      f"{line}: this TensorFlow release changed it; dist_keras needs "
      "updating (dist_keras/distribute/strategies.py).")
