"""Before a multi-worker strategy is built: wait until every other task of
the cluster listens at its address, saying for whom and where, with a
deadline, and stopped at once by SIGTERM or Ctrl-C.

MultiWorkerMirroredStrategy's construction waits for every peer inside one
call that holds the interpreter and installs TensorFlow's own SIGTERM
handler (sigterm.py): a peer that never came (a pod not scheduled, a wrong
address in TF_CONFIG) left a worker silent, with no deadline, deaf to
SIGTERM until Kubernetes' SIGKILL. TensorFlow's own deadline cannot stand
in (TF 2.21): the coordination service's cluster_register_timeout_in_ms
bounds the other tasks' registration only, and then reads as a lost
peer; the service's leader (the chief, or worker 0) waited past it.

So each task first holds a plain listening socket on its own port (it
accepts and closes what connects: nothing is read or sent) until it has
seen every peer's port answer, that peer's placeholder or TensorFlow's
server, which takes the port once the placeholder is closed. Nothing of
training goes through it: TensorFlow's collective runtime is the only
transport. What it cannot see: a peer that ends between being seen and
starting its runtime, or another process answering at a peer's port:
start_watch.py ends TensorFlow's wait then.
"""
import contextlib
import select
import signal
import socket
import time

from dist_keras import errors
from dist_keras import signals
from dist_keras import terminal
from dist_keras.distribute import peers
from dist_keras.distribute import tfconfig

# Seconds between rounds of probes (a connect each to the peers not yet
# seen), and between "still waiting" lines.
PROBE_SECONDS = 0.25
PROGRESS_SECONDS = 30.0
_FIX = {True: "start it, or fix its address in TF_CONFIG",
        False: "start them, or fix their addresses in TF_CONFIG"}


class _Stop(BaseException):
  """SIGTERM or Ctrl-C while waiting (raised by the handler)."""

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum


def wait_for_peers(cluster: tfconfig.ClusterSpec, timeout_seconds: float,
                   every: float = PROGRESS_SECONDS,
                   probe=peers.listening) -> None:
  """Returns once every other task of `cluster` listens at its address.

  Args:
    cluster: the checked TF_CONFIG.
    timeout_seconds: how long to wait (runtime.peer_start_timeout_seconds);
      0 waits as long as it takes.
    every: seconds between the lines that say who is still awaited.
    probe: "host:port" -> True when something listens there.

  Raises:
    PeersNeverStarted: `timeout_seconds` passed first (exit 200).
    Preempted, Interrupted: SIGTERM, Ctrl-C while waiting (143, 130).
  """
  waiting = others(cluster)
  if not waiting:
    return
  me = f"{cluster.task_type}:{cluster.task_index}"
  limit = (f"up to {timeout_seconds:g} s" if timeout_seconds
           else "with no time limit")
  terminal.say(f"dist_keras: {me} waits for the other tasks to start "
               f"({listed(waiting)}; {limit}: "
               "runtime.peer_start_timeout_seconds)")
  start = said = time.monotonic()
  try:
    with _placeholder(cluster.address) as server, _stop_signals():
      while True:
        waiting = {t: a for t, a in waiting.items() if probe(a) is not True}
        waited = time.monotonic() - start
        if not waiting:
          break
        if timeout_seconds and waited >= timeout_seconds:
          raise errors.PeersNeverStarted(_never_line(me, waiting, waited))
        if time.monotonic() - said >= every:
          said = time.monotonic()
          terminal.say(f"dist_keras: {me} still waits for "
                       f"{listed(waiting)} ({waited:.0f} s)")
        _pause(server, PROBE_SECONDS)
  except _Stop as stop:
    raise _stopped(stop.signum, me, waiting) from None
  terminal.say(f"dist_keras: {me} saw every other task start after "
               f"{waited:.0f} s; starting TensorFlow's collective runtime")


def others(cluster: tfconfig.ClusterSpec) -> dict[str, str]:
  """{"worker:1": "host:port"} for every task of `cluster` but this one."""
  return {f"{kind}:{i}": address
          for kind, addresses in cluster.cluster.items()
          for i, address in enumerate(addresses)
          if (kind, i) != (cluster.task_type, cluster.task_index)}


def listed(waiting: dict) -> str:
  """"worker:1 at host:port, ..." for the tasks of `waiting`."""
  return ", ".join(f"{task} at {address}" for task, address in waiting.items())


def _never_line(me: str, waiting: dict, waited: float) -> str:
  return (f"{me} waited {waited:.0f} s for {listed(waiting)}, which never "
          f"started listening: {_FIX[len(waiting) == 1]} (on Kubernetes, "
          "`kubectl describe pod` of a pod not Running says why), or raise "
          "runtime.peer_start_timeout_seconds (0: no limit); nothing was "
          "written.")


def _stopped(signum, me: str, waiting: dict) -> BaseException:
  """The run's error for a stop request while waiting: exit 143 or 130."""
  name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
  kind = (errors.Interrupted if signum == signal.SIGINT
          else errors.Preempted)
  return kind(f"stopped by {name} before training began, while {me} waited "
              f"for {listed(waiting)} to start; nothing was written; rerun "
              "the same command on every worker.")


@contextlib.contextmanager
def _placeholder(address: str):
  """A socket listening on this task's port (every interface, as
  TensorFlow's server), or None if it cannot be had (the peers then see
  this task once its runtime listens)."""
  port = int(address.rpartition(":")[2])
  dual = socket.has_dualstack_ipv6()
  try:
    server = socket.create_server(
        ("", port), family=socket.AF_INET6 if dual else socket.AF_INET,
        dualstack_ipv6=dual)
  except OSError:
    server = None
  try:
    yield server
  finally:
    if server is not None:
      server.close()


def _pause(server, seconds: float) -> None:
  """Sleeps `seconds`, closing each connection a peer's probe makes."""
  if server is None:
    time.sleep(seconds)
    return
  if select.select([server], [], [], seconds)[0]:
    try:
      connection, _ = server.accept()
      connection.close()
    except OSError:
      pass


def _stop_signals():
  """SIGTERM and Ctrl-C raise _Stop while the block runs (main thread
  only; an ignored signal stays ignored: dist_keras/signals.py)."""

  def stop(signum, frame):  # pylint: disable=unused-argument
    raise _Stop(signum)

  return signals.caught(stop, (signal.SIGTERM, signal.SIGINT))
