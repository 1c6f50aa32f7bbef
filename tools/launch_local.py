"""Starts a MultiWorkerMirroredStrategy cluster as local processes.

Each worker runs the command after `--` with its own TF_CONFIG; the launcher
relays their output line by line, prefixed `[w0] `, `[w1] `, ..., and stops
the whole cluster as soon as one worker fails, so a dead peer never leaves the
others hanging in a collective.

  python tools/launch_local.py --num_workers=2 -- \\
      python -m dist_keras.train --config=configs/lstm_longmem.py \\
      --workdir=/tmp/run
  # Task 1 of a hand-made cluster (run the other tasks on their hosts):
  python tools/launch_local.py --worker_hosts=10.0.0.1:2222,10.0.0.2:2222 \\
      --task_index=1 -- python -m dist_keras.train --workdir=/tmp/run

Exit status: 0 when every worker exits 0; else the first failed worker's code
(128+S if signal S killed it); 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP;
2 for bad arguments; 127 if the command cannot start. With --max_restarts=K
the whole cluster restarts (fresh ports) up to K times after a RETRYABLE
failure: code >= 128 (killed by a signal, or the program's own "peer lost"
code in that range) or one of --retryable_codes. Codes 1 and 2 (bugs, bad
flags) never restart: the rerun would fail the same way.

Security: TF's collective gRPC ports are unauthenticated; anyone who can reach
them can join or disturb the cluster. Keep --host and --worker_hosts on
loopback or a private network.

Limits: ports are free when chosen but another process could take one before
its worker binds it (rare; a restart picks fresh ones). A launcher killed with
SIGKILL cannot stop its workers.
"""
import argparse
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import common
from common import BadInput

PROG = "launch_local"
EXIT_CANNOT_START = 127  # The shell's code for "command not found".
# Signals that stop the launcher; each is forwarded as SIGTERM to the workers.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_SECONDS = 0.05
# How long to wait for a relay thread to drain a dead worker's last lines.
DRAIN_SECONDS = 2.0
say = functools.partial(common.say, PROG)  # One launcher line on stderr.


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
  """Returns `n` distinct TCP ports that are free on `host` right now.

  All sockets stay bound until every port is chosen, so the OS cannot hand
  out the same port twice.
  """
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sockets.append(s)
      s.bind((host, 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def make_tf_config(hosts: list[str], index: int) -> dict:
  """TF_CONFIG (as a dict) for worker `index` of the cluster `hosts`.

  No "chief" task: TF makes worker 0 the chief, which writes checkpoints.
  """
  return {"cluster": {"worker": list(hosts)},
          "task": {"type": "worker", "index": index}}


def exit_status(returncode: int) -> int:
  """A Popen returncode as a shell exit status: killed by signal S -> 128+S."""
  return 128 - returncode if returncode < 0 else returncode


def is_retryable(code: int, extra_codes=frozenset()) -> bool:
  """Whether a cluster that failed with exit `code` is worth restarting.

  Codes >= 128 mean a signal (OOM killer, preemption, a lost peer) rather
  than a bug, as with Kubernetes' exit-code restart policies.
  """
  return code >= 128 or code in extra_codes


def parse_hosts(text: str) -> list[str]:
  """Parses "h1:p1,h2:p2,..." into a list, refusing malformed entries."""
  hosts = [h.strip() for h in text.split(",")]
  for host in hosts:
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
      raise BadInput(f"--worker_hosts entry {host!r} must be host:port with "
                     "a port in 1..65535.")
  if len(set(hosts)) != len(hosts):
    raise BadInput(f"--worker_hosts={text!r} names an address twice; each "
                   "worker needs its own.")
  return hosts


def parse_codes(text: str) -> frozenset[int]:
  """Parses --retryable_codes "3,75" into {3, 75}; "" means none."""
  try:
    codes = frozenset(int(c) for c in text.split(",") if c.strip())
  except ValueError:
    raise BadInput(f"--retryable_codes={text!r} must be comma-separated "
                   "integers, e.g. 75,76.") from None
  if any(not 0 < c < 256 for c in codes):
    raise BadInput(f"--retryable_codes={text!r}: codes must be in 1..255.")
  return codes


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
  """Splits argv at the first `--` into (launcher options, worker command)."""
  if "--" not in argv:
    return argv, []
  split = argv.index("--")
  return argv[:split], argv[split + 1:]


def parse_args(argv=None) -> argparse.Namespace:
  """Parses and checks the launcher's arguments.

  Returns:
    The options, plus `command` (the worker command), `hosts` (None with
    --num_workers: ports are picked per attempt) and `codes` (the extra
    retryable exit codes).

  Raises:
    BadInput: an argument is missing or malformed.
  """
  options, command = _split_command(
      list(sys.argv[1:] if argv is None else argv))
  p = common.Parser(prog="launch_local.py", allow_abbrev=False,
                    usage="%(prog)s (--num_workers=N | --worker_hosts=H:P,"
                    "... --task_index=I) [options] -- COMMAND ...",
                    description=__doc__.splitlines()[0])
  cluster = p.add_mutually_exclusive_group(required=True)
  cluster.add_argument("--num_workers", type=int,
                       help="Start N local workers on free ports of --host.")
  cluster.add_argument("--worker_hosts",
                       help="A hand-made cluster, host:port,...: start only "
                       "task --task_index of it.")
  p.add_argument("--task_index", type=int,
                 help="With --worker_hosts: which task this machine runs.")
  p.add_argument("--host",
                 help="With --num_workers: the address the workers listen on "
                 "(default 127.0.0.1). Collective ports are unauthenticated: "
                 "keep it on loopback or a private network.")
  p.add_argument("--grace_seconds", type=float, default=10.0,
                 help="After SIGTERM, seconds before SIGKILL (default "
                 "%(default)s).")
  p.add_argument("--max_restarts", type=int, default=0,
                 help="Restart the cluster up to K times after a retryable "
                 "failure (default %(default)s).")
  p.add_argument("--retryable_codes", default="",
                 help="Comma-separated exit codes below 128 that also "
                 "restart (default: none; codes >= 128 always do).")
  args = p.parse_args(options)
  _check(args, command)
  args.command = command
  args.codes = parse_codes(args.retryable_codes)
  args.hosts = parse_hosts(args.worker_hosts) if args.worker_hosts else None
  if args.hosts and not 0 <= args.task_index < len(args.hosts):
    raise BadInput(f"--task_index={args.task_index} must be in "
                   f"0..{len(args.hosts) - 1} for {len(args.hosts)} hosts.")
  args.host = args.host or "127.0.0.1"
  return args


def _check(args: argparse.Namespace, command: list[str]) -> None:
  """Refuses option combinations argparse cannot express."""
  if not command:
    raise BadInput("give the worker command after --, e.g. -- python -m "
                   "dist_keras.train --workdir=/tmp/run")
  if args.num_workers is not None and args.num_workers < 1:
    raise BadInput(f"--num_workers={args.num_workers} must be >= 1.")
  if args.worker_hosts and args.task_index is None:
    raise BadInput("--worker_hosts needs --task_index: which task runs here.")
  if args.worker_hosts and args.host:
    raise BadInput("--host goes with --num_workers; --worker_hosts already "
                   "names the addresses.")
  if args.num_workers is not None and args.task_index is not None:
    raise BadInput("--task_index goes with --worker_hosts; --num_workers "
                   "starts every task.")
  if args.grace_seconds < 0:
    raise BadInput(f"--grace_seconds={args.grace_seconds} must be >= 0.")
  if args.max_restarts < 0:
    raise BadInput(f"--max_restarts={args.max_restarts} must be >= 0.")


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


def _relay(pipe, out, prefix: bytes) -> None:
  """Copies `pipe` to `out` line by line, each line after `prefix`."""
  with pipe:
    for line in iter(pipe.readline, b""):
      if not line.endswith(b"\n"):
        line += b"\n"
      with common.OUTPUT_LOCK:
        try:
          out.write(prefix + line)
          out.flush()
        except (OSError, ValueError):
          # Our own output is gone (closed pipe); keep draining anyway so
          # the worker never blocks on a full pipe.
          pass


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

  def start(self) -> None:
    """Starts one process per index. Raises OSError if the command can't."""
    for index in self._indices:
      env = dict(os.environ, PYTHONUNBUFFERED="1",
                 TF_CONFIG=json.dumps(make_tf_config(self._hosts, index)))
      proc = subprocess.Popen(self._command, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
      prefix = f"[w{index}] ".encode()
      threads = [threading.Thread(target=_relay, args=(pipe, out, prefix),
                                  daemon=True)
                 for pipe, out in ((proc.stdout, sys.stdout.buffer),
                                   (proc.stderr, sys.stderr.buffer))]
      for t in threads:
        t.start()
      self._workers.append((index, proc, threads))

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


def _cluster_hosts(args) -> list[str]:
  """This attempt's addresses: the hand-made list, or fresh free ports."""
  if args.hosts:
    return args.hosts
  try:
    ports = free_ports(args.num_workers, args.host)
  except OSError as e:
    raise BadInput(f"--host={args.host}: cannot bind a port there ({e}); "
                   "give an address of this machine.") from None
  return [f"{args.host}:{port}" for port in ports]


def _attempt(args, signals):
  """Runs the cluster once; returns (index, exit status) of a failure."""
  hosts = _cluster_hosts(args)
  indices = ([args.task_index] if args.hosts
             else list(range(args.num_workers)))
  cluster = Cluster(args.command, hosts, indices, args.grace_seconds, signals)
  try:
    cluster.start()
    failure = cluster.wait()
    if failure and len(indices) > 1:
      say(f"worker {failure[0]} exited with code {failure[1]}; "
          "stopping the others")
    elif failure:
      say(f"worker {failure[0]} exited with code {failure[1]}")
    elif signals:
      say(f"got {signal.Signals(signals[0]).name}; stopping the workers")
    return failure
  finally:
    cluster.stop()


def run(args, signals: list[int]) -> int:
  """Runs the cluster, restarting after retryable failures; an exit status."""
  for attempt in range(args.max_restarts + 1):
    try:
      failure = _attempt(args, signals)
    except BadInput as e:
      return common.fail(PROG, e)
    except OSError as e:
      say(f"cannot start {args.command[0]!r}: {e.strerror or e}")
      return EXIT_CANNOT_START
    if signals:
      return 128 + signals[0]
    if failure is None:
      return 0
    index, code = failure
    if attempt == args.max_restarts or not is_retryable(code, args.codes):
      return code
    say(f"restart {attempt + 1}/{args.max_restarts} after worker {index} "
        f"exited with code {code}")
  raise AssertionError("unreachable")


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except BadInput as e:
    return common.fail(PROG, e)
  signals = []
  # Record, don't raise: an exception mid-Popen could orphan a worker.
  previous = {s: signal.signal(s, lambda signum, _: signals.append(signum))
              for s in STOP_SIGNALS}
  try:
    return run(args, signals)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


if __name__ == "__main__":
  sys.exit(main())
