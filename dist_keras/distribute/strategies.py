"""The one place that turns `config.runtime` into a tf.distribute strategy.

Logical CPU devices must be configured before TensorFlow initialises its
runtime, so `make` is called before anything else touches devices.
"""
import dataclasses
import errno
import os
import socket

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils  # pylint: disable=g-direct-tensorflow-import

from dist_keras import installation
from dist_keras import terminal
from dist_keras.configs import base
from dist_keras.distribute import cluster_start
from dist_keras.distribute import cpus
from dist_keras.distribute import rendezvous
from dist_keras.distribute import sigterm
from dist_keras.distribute import start_watch
from dist_keras.distribute import tfconfig
from dist_keras.distribute import tpus
from dist_keras.errors import UserError


def get_strategy(runtime_cfg, environ=None,
                 path_exists=os.path.exists) -> tf.distribute.Strategy:
  """`make` of the strategy `runtime_cfg.strategy` chooses here
  (tfconfig.chosen), for a caller with no door that chose it (tools).

  Raises:
    UserError: a bad TF_CONFIG, or one that contradicts the strategy; as
      `make`.
  """
  return make(None, runtime_cfg, environ, path_exists)


def make(name: str, runtime_cfg, environ=None,
         path_exists=os.path.exists) -> tf.distribute.Strategy:
  """Returns the strategy `name` (tfconfig.chosen for `runtime_cfg`).

  Args:
    name: the strategy to build, as the door chose it; None: chosen here.
    runtime_cfg: `config.runtime` (strategy, num_cpu_devices, collective...).
    environ: where to read TF_CONFIG and TPU variables (default os.environ).
    path_exists: where to look for TPU devices (default os.path.exists).

  Raises:
    UserError: a bad device count, or runtime.strategy=tpu with no TPU.
  """
  environ = os.environ if environ is None else environ
  if name is None:  # No door chose it.
    name = tfconfig.chosen(runtime_cfg.strategy, tfconfig.from_env(environ),
                           environ, path_exists)
  if name == "tpu":
    found = tpus.get_strategy(runtime_cfg.tpu,
                                 required=runtime_cfg.strategy == "tpu",
                                 environ=environ, path_exists=path_exists)
    if found is not None:
      return found
    # auto, and the TPU did not start (tpus said why); a failed TPU start
    # that started TensorFlow's runtime leaves the CPU unsplit.
    devices, _ = cpus.local_or_started(runtime_cfg.num_cpu_devices)
    return tf.distribute.MirroredStrategy(devices)
  if name == "multi_worker_mirrored":
    key = ("multi_worker", environ.get("TF_CONFIG"))
    for made in _STRATEGIES:  # (At most one: a second cannot start.)
      if made[:2] == key:
        cluster_start.refuse_other_options(made[2:], _options_key(runtime_cfg),
                                           _OPTIONS)
    return _once((*key, *_options_key(runtime_cfg)),
                 lambda: multi_worker(runtime_cfg, tfconfig.from_env(environ)))
  if name == "one_device":
    device = cpus.local_devices(1)[0]  # (num_cpu_devices does not apply.)
    return _once(("one_device", device),
                 lambda: tf.distribute.OneDeviceStrategy(device))
  # mirrored: every local GPU, else the logical CPU devices.
  devices = (cpus.auto_devices if runtime_cfg.strategy == "auto"
             else cpus.local_devices)(runtime_cfg.num_cpu_devices)
  return _once(("mirrored", *devices),
               lambda: tf.distribute.MirroredStrategy(devices))


# One strategy object per kind and devices in a process, shared by its runs:
# no second one to give keys of its own (own_collective_keys, below, does
# that for a strategy the user makes).
_STRATEGIES = {}


def _once(key, make):
  if key not in _STRATEGIES:
    _STRATEGIES[key] = make()
  return _STRATEGIES[key]


_OPTIONS = ("collective", "bytes_per_pack", "timeout_seconds")


def _options_key(runtime_cfg) -> tuple:
  return tuple(runtime_cfg[name] for name in _OPTIONS)


def prepare(name: str, environ=None) -> None:
  """`make`'s strategy, with base.py's runtime options, made now where
  `name` (runtime.strategy) picks MultiWorkerMirroredStrategy for this
  process's TF_CONFIG (dist_keras.prepare_runtime, before anything uses
  TensorFlow: cluster_start.py); fit's `make` reuses it."""
  environ = os.environ if environ is None else environ
  cluster = tfconfig.from_env(environ)
  if cluster is None:
    return
  runtime_cfg = base.get_config().runtime
  runtime_cfg.strategy = name
  chosen = tfconfig.chosen(name, cluster, environ)
  if chosen == "multi_worker_mirrored":
    make(chosen, runtime_cfg, environ)


# Every MirroredStrategy numbers its collectives from the same keys (group
# 1, instances from 100), and TensorFlow's collective runtime remembers for
# the rest of the process what each key first did: a sweep's second strategy
# object doing something else under a key the first used failed ("Collective
# instance 110 expected type 2 and data_type 3 but got type 0"). The first
# strategy moves too: dist_keras' collectives (all-gathers, integer sums)
# under 100... broke every later multi-replica run of the process, Keras'
# own fit under a new strategy included (it starts at 100), and a Keras fit
# before broke dist_keras' ("Restart your program to reset"). The gap leaves
# an earlier strategy room to trace more if it is trained under again, and
# Keras' fit under new strategies room below the first.
_KEY_GAP = 100_000
_KEYS_SEEN = []  # Each strategy's CollectiveKeys: small, kept past it.
# TensorFlow's private key table, read here alone: a release that renames
# it is named in one line (installation.require).
_HERE = "dist_keras/distribute/strategies.py"


def own_collective_keys(strategy) -> None:
  """Moves the collective instance keys of a MirroredStrategy not trained
  under before in this process past TensorFlow's start, its own (a
  strategy Keras' fit used) and those of every strategy trained under
  before; one seen before keeps its own."""
  if not isinstance(strategy, tf.distribute.MirroredStrategy):
    return
  keys = installation.require(strategy.extended, "_collective_keys",
                        "its collective keys", _HERE)
  if any(seen is keys for seen in _KEYS_SEEN):
    return
  groups = installation.require(keys, "_instance_key_table", "its instance keys",
                          _HERE).values()
  first = installation.require(cross_device_utils, "INSTANCE_KEY_START_NUMBER",
                         "the first instance key", _HERE)
  # Keys only grow: functions traced under the strategy before keep theirs.
  start = max([first] + [key for seen in [*_KEYS_SEEN, keys]
                         for group in seen._instance_key_table.values()  # pylint: disable=protected-access
                         for key in group.values()]) + _KEY_GAP
  for group in groups:
    group.update(dict.fromkeys(group, start))
  _KEYS_SEEN.append(keys)


def is_chief(strategy) -> bool:
  """Whether this process writes summaries, checkpoints and files."""
  try:
    return bool(strategy.extended.should_checkpoint)
  except (AttributeError, NotImplementedError):
    return True


def num_workers(strategy) -> int:
  """Processes taking part in the strategy's collectives (1 if local)."""
  resolver = strategy.cluster_resolver  # None for single-host strategies.
  if resolver is None:
    return 1
  spec = resolver.cluster_spec()
  return max(1, sum(spec.num_tasks(job) for job in ("chief", "worker")
                    if job in spec.jobs))


@dataclasses.dataclass(frozen=True)
class Role:
  """This process's part in the job, asked of its strategy once (api.build)
  and handed to what needs it: the strategy, whether this process writes
  the run's files, how many processes take part in its collectives, and
  how many input pipelines feed its replicas (one per worker, or one per
  replica: data.pipeline_per_replica)."""
  strategy: tf.distribute.Strategy
  chief: bool
  workers: int
  pipelines: int = 1

  @classmethod
  def of(cls, strategy, per_replica_pipelines: bool = False) -> "Role":
    workers = num_workers(strategy)
    return cls(strategy, is_chief(strategy), workers,
               strategy.num_replicas_in_sync if per_replica_pipelines
               else workers)


def worker_id(strategy) -> int:
  """This process's place among the workers (the chief first), as
  tf.distribute numbers the input pipeline of a worker (0 if local)."""
  resolver = strategy.cluster_resolver
  if resolver is None or resolver.task_type not in ("chief", "worker"):
    return 0
  return tfconfig.ClusterSpec(resolver.cluster_spec().as_dict(),
                              resolver.task_type,
                              int(resolver.task_id or 0)).worker_id


def display_name(strategy) -> str:
  """The public name of `strategy`'s class (TF's multi-worker class is
  CollectiveAllReduceStrategy under the hood; users know the alias)."""
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return "MultiWorkerMirroredStrategy"
  if isinstance(strategy, tf.distribute.TPUStrategy):  # TPUStrategyV2.
    return "TPUStrategy"
  return type(strategy).__name__


def communication_options(runtime_cfg):
  """CommunicationOptions from `runtime.collective/bytes_per_pack/timeout`."""
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=runtime_cfg.bytes_per_pack,
      timeout_seconds=runtime_cfg.timeout_seconds or None,
      implementation=getattr(  # validate.COLLECTIVES' names, upper-cased.
          tf.distribute.experimental.CommunicationImplementation,
          runtime_cfg.collective.upper()))


def multi_worker(runtime_cfg,
                 cluster: tfconfig.ClusterSpec) -> tf.distribute.Strategy:
  """MultiWorkerMirroredStrategy over the TF_CONFIG cluster.

  Each worker contributes its local GPUs, or ONE CPU device: TensorFlow's
  multi-worker strategy does not split a worker's CPU, so
  `runtime.num_cpu_devices` does not apply. Construction starts this task's
  gRPC server and waits for every peer to come up; it starts once every
  peer listens (rendezvous.wait_for_peers, within
  `runtime.peer_start_timeout_seconds`).
  """
  options = communication_options(runtime_cfg)
  cluster_start.refuse_started(cluster)  # (Before anyone waits for it.)
  check_port_free(cluster)
  note = cpu_devices_note(runtime_cfg.num_cpu_devices)
  if note:
    terminal.say(note)
  # TensorFlow's own wait for the peers says nothing, has no deadline and
  # ignores SIGTERM: ours first (rendezvous.py).
  rendezvous.wait_for_peers(cluster, runtime_cfg.peer_start_timeout_seconds)
  # Its wait has no deadline either, and no Python runs in it (start_watch).
  with sigterm.kept(), start_watch.watched(
      f"{cluster.task_type}:{cluster.task_index}", rendezvous.others(cluster),
      runtime_cfg.peer_start_timeout_seconds):
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options)


def cpu_devices_note(num_cpu_devices: int) -> str | None:
  """The line for a runtime.num_cpu_devices set for a multi-worker run,
  where it does not apply (not ignored without a word; not refused: one
  config may serve a Mirrored run on one host and a cluster alike)."""
  default = base.get_config().runtime.num_cpu_devices
  if num_cpu_devices in (1, default):
    return None
  return (f"dist_keras: runtime.num_cpu_devices={num_cpu_devices} does not "
          "apply to a multi-worker run: each worker trains on its GPUs or "
          "one CPU device")


def check_port_free(spec: tfconfig.ClusterSpec) -> None:
  """UserError if this task's port is taken on this machine: TensorFlow's
  server (on every interface, whatever the host) would fail with gRPC
  error lines and exit 1. Only a listener counts (SO_REUSEADDR, as gRPC's):
  an earlier run's closed connections do not."""
  port = int(spec.address.rpartition(":")[2])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        return  # (TensorFlow says what else is wrong with it.)
      raise UserError(
          f"TF_CONFIG gives this task ({spec.task_type}:{spec.task_index}) "
          f"{spec.address}, but port {port} is in use on this machine (by "
          "another process, or a worker of an earlier run still running); "
          "free it, or give the task another port.") from None
