"""The worker processes of one local cluster attempt (the launcher, cli.py):
ports, TF_CONFIG, starting, relaying, watching and stopping them.

Each worker runs the launcher's command with its own TF_CONFIG; its output
is relayed line by line after `[wI] `.
"""
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from dist_keras import commands
from dist_keras.errors import EXIT_CONFIG_ERROR

POLL_SECONDS = 0.05
# How long to wait for a relay thread to drain a dead worker's last lines.
DRAIN_SECONDS = 2.0
# dist_keras' refusal of a task's port that another process holds
# (dist_keras/distribute/strategies.py check_port_free): its one line on
# stderr and exit 2, before TensorFlow starts its server.
PORT_IN_USE = re.compile(
    rb"dist_keras: error: TF_CONFIG gives this task \(\w+:\d+\) \S+, but "
    rb"port (\d+) is in use on this machine")


# Ports picked for workers: from here up to the OS's ephemeral range
# (above Ray's worker ports, 10002-19999 by default).
PICK_FROM = 20000
_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
_RANDOM = random.SystemRandom()


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
  """Returns `n` distinct TCP ports that are free on `host` right now.

  Picked at random below the OS's ephemeral range where it leaves room:
  the ports the OS gives to bind(0) and to outgoing connections, which any
  process may take before the worker binds it (a freed port there was the
  next connection's source port). All sockets stay bound until every port
  is chosen, so no port is picked twice.
  """
  below = range(PICK_FROM, ephemeral_low())
  sockets = []
  try:
    # The system's randomness: a process that seeded Python's `random` (a
    # run's keras.utils.set_random_seed) would pick what its twin picks.
    for candidate in _RANDOM.sample(below, min(len(below), 50 * n)):
      if len(sockets) == n:
        break
      sockets += _bound(host, candidate)
    while len(sockets) < n:  # No room below the range: the OS picks.
      sockets += _bound(host, 0)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _bound(host: str, port: int) -> list[socket.socket]:
  """[a socket bound to (host, port)], or [] if the port is taken."""
  s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    s.bind((host, port))
  except OSError:
    s.close()
    if port == 0:
      raise
    return []
  return [s]


def ephemeral_low() -> int:
  """The first port of the OS's ephemeral range (Linux's setting; else
  32768, below the IANA range other systems use)."""
  try:
    with open(_EPHEMERAL, encoding="ascii") as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return 32768


def make_tf_config(hosts: list[str], index: int) -> dict:
  """TF_CONFIG (as a dict) for worker `index` of the cluster `hosts`.

  No "chief" task: TF makes worker 0 the chief, which writes checkpoints.
  """
  return {"cluster": {"worker": list(hosts)},
          "task": {"type": "worker", "index": index}}


def worker_path(path: str, python: str = sys.executable) -> str:
  """PATH for the workers: the launcher's Python's folder first, as
  `source .venv/bin/activate` puts it, so a bare `python` in the command is
  the launcher's interpreter (the one that has dist_keras) and not another
  one found on PATH. `path` unchanged if that folder is already first."""
  folder = os.path.dirname(python)
  if not folder or path.split(os.pathsep)[0] == folder:
    return path
  return folder + os.pathsep + path


def exit_status(returncode: int) -> int:
  """A Popen returncode as a shell exit status: killed by signal S -> 128+S."""
  return 128 - returncode if returncode < 0 else returncode


def group_running(pgid: int) -> bool:
  """Whether process group `pgid` has a member that is not a zombie.

  kill() counts zombies as members, but they run nothing; an init process
  that reaps orphans slowly (or never, in some containers) must not hold the
  launcher for the whole grace period.
  """
  try:
    os.killpg(pgid, 0)
  except ProcessLookupError:
    return False
  if not os.path.isdir("/proc"):
    return True  # Not Linux: trust kill().
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      state, _, pgrp = process_stat(int(pid))
    except (OSError, ValueError):
      continue  # Ended while we looked.
    if pgrp == pgid and state not in ("Z", "X"):
      return True
  return False


def process_stat(pid: int) -> tuple[str, int, int]:
  """(state, parent pid, process group) of a Linux process, from /proc.

  Raises:
    OSError: the process has ended (or this is not Linux).
  """
  with open(f"/proc/{pid}/stat") as f:
    # After the ")" closing the command name: state, ppid, pgrp, ...
    state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
  return state, int(ppid), int(pgrp)


def _relay(pipe, err: bool, prefix: bytes, watch=None) -> None:
  """Copies `pipe` to stdout (stderr: `err`) line by line, each line after
  `prefix`; each line goes to `watch` too, if given. Our own output gone
  (a closed pipe) goes to /dev/null: the pipe is drained anyway, so the
  worker never blocks on a full pipe."""
  with pipe:
    for line in iter(pipe.readline, b""):
      if not line.endswith(b"\n"):
        line += b"\n"
      if watch:
        watch(line)
      commands.relay(prefix + line, err)


class Cluster:
  """The worker processes of one attempt: start, watch, stop.

  Each worker leads its own session (process group), so a signal to the
  group also reaches the worker's own subprocesses, and a Ctrl-C at the
  terminal reaches only the launcher, which then stops the workers in order.
  """

  def __init__(self, command, hosts, indices, grace_seconds, signals):
    """`signals`: the launcher's list of received signal numbers (shared)."""
    self._command = command
    self._hosts = hosts
    self._indices = indices
    self._grace_seconds = grace_seconds
    self._signals = signals
    self._workers = []  # (index, Popen, relay threads)
    self._refused = {}  # {index: the port its worker said is in use}

  def start(self) -> None:
    """Starts one process per index. Raises OSError if the command can't."""
    for index in self._indices:
      env = dict(os.environ, PYTHONUNBUFFERED="1",
                 PATH=worker_path(os.environ.get("PATH", os.defpath)),
                 TF_CONFIG=json.dumps(make_tf_config(self._hosts, index)))
      proc = subprocess.Popen(self._command, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
      prefix = f"[w{index}] ".encode()
      watch = functools.partial(self._watch, index)
      threads = [threading.Thread(target=_relay, args=(pipe, err, prefix, w),
                                  daemon=True)
                 for pipe, err, w in ((proc.stdout, False, None),
                                      (proc.stderr, True, watch))]
      for t in threads:
        t.start()
      self._workers.append((index, proc, threads))

  def _watch(self, index: int, line: bytes) -> None:
    found = PORT_IN_USE.search(line)
    if found:
      self._refused[index] = int(found.group(1))

  def port_taken(self, failure) -> int | None:
    """The port of worker `failure` = (index, exit status), if it exited
    2 refusing that port, its own, as held by another process; else None
    (a failure of any other kind)."""
    index, code = failure
    own = int(self._hosts[index].rpartition(":")[2])
    refused = self._refused.get(index)
    return own if code == EXIT_CONFIG_ERROR and refused == own else None

  def wait(self):
    """Blocks until a worker fails, all succeed, or a signal arrives.

    Returns:
      (index, exit status) of the first worker seen failing, else None (all
      exited 0, or the launcher got a signal: see the shared list).
    """
    while not self._signals:
      running = False
      for index, proc, threads in self._workers:
        code = proc.poll()
        if code:
          self._drain(threads)  # Its last words come before our verdict.
          return index, exit_status(code)
        running = running or code is None
      if not running:
        return None
      time.sleep(POLL_SECONDS)
    return None

  def stop(self) -> None:
    """SIGTERMs every worker's group; SIGKILLs what is left after grace.

    Also runs after a clean finish, for subprocesses a worker left behind.
    A further signal to the launcher during the grace period cuts it short.
    """
    self._signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + self._grace_seconds
    signals_seen = len(self._signals)
    while (any(self._alive(proc) for _, proc, _ in self._workers)
           and time.monotonic() < deadline
           and len(self._signals) == signals_seen):
      time.sleep(POLL_SECONDS)
    self._signal_groups(signal.SIGKILL)
    for _, proc, threads in self._workers:
      proc.wait()
      self._drain(threads)

  def _signal_groups(self, signum: int) -> None:
    for _, proc, _ in self._workers:
      try:
        os.killpg(proc.pid, signum)  # Session leader: its pgid is its pid.
      except ProcessLookupError:
        pass  # The group has ended.

  @staticmethod
  def _alive(proc) -> bool:
    """Whether the worker or anything in its process group still runs."""
    return proc.poll() is None or group_running(proc.pid)

  @staticmethod
  def _drain(threads) -> None:
    # Bounded: a subprocess that escaped the group may hold the pipe open.
    for t in threads:
      t.join(DRAIN_SECONDS)
