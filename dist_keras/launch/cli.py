"""Starts a MultiWorkerMirroredStrategy cluster as local processes.

Each worker runs the command after `--` with its own TF_CONFIG; the launcher
relays their output line by line, prefixed `[w0] `, `[w1] `, ..., and stops
the whole cluster as soon as one worker fails, so a dead peer never leaves the
others hanging in a collective.

  python -m dist_keras.launch --num_workers=2 -- \\
      python -m dist_keras.train --config=lstm_longmem --workdir=/tmp/run
  # Task 1 of a hand-made cluster (run the other tasks on their hosts):
  dist-keras-launch --worker_hosts=10.0.0.1:2222,10.0.0.2:2222 \\
      --task_index=1 -- python -m dist_keras.train --workdir=/tmp/run

Each worker's PATH begins with the folder of the Python running the
launcher, as `source .venv/bin/activate` does: a bare `python` in the
command is this interpreter (the one with dist_keras), even with no venv
activated (PATH's own `python` had no dist_keras: every worker exited 1).

`dist-keras-launch` is the installed console script of the same; in a
checkout, the tools folder's launch_local.py runs it too (its lines then
begin `launch_local: `, as they always have).

Exit status: 0 when every worker exits 0; else the first failed worker's code
(128+S if signal S killed it); 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP
(a Ctrl-C or hangup ignored when it started, as under nohup, stays ignored);
2 for bad arguments; 127 if the command cannot start. With --max_restarts=K
the whole cluster restarts (fresh ports) up to K times after a RETRYABLE
failure: code >= 128 (killed by a signal, or the program's own "peer lost"
code in that range) or one of --retryable_codes. Codes 1 and 2 (bugs, bad
flags) never restart: the rerun would fail the same way.

A port taken between its pick and its worker's bind: the ports are free when
picked, but the workers bind them seconds later (Python and TensorFlow start
first), and any process may take one in between. A dist_keras worker then
refuses it (exit 2, "port N is in use on this machine"); with --num_workers
the launcher stops every worker, picks fresh ports and starts them all again,
up to PORT_RETRIES times, saying so in one line. These restarts do not count
against --max_restarts; any other exit 2, a port of --worker_hosts (yours to
choose) or another program's bind error is a failure as before.

Security: TF's collective gRPC ports are unauthenticated; anyone who can reach
them can join or disturb the cluster. Keep --host and --worker_hosts on
loopback or a private network.

Limits: a launcher killed with SIGKILL cannot stop its workers.
"""
import argparse
import os
import signal
import sys

from dist_keras import signals
from dist_keras.commands import Parser, fail, say
from dist_keras.errors import UserError
from dist_keras.launch.cluster import Cluster, free_ports

PROG = "dist-keras-launch"  # Its lines' prefix: the console script's name.
EXIT_CANNOT_START = 127  # The shell's code for "command not found".
# Signals that stop the launcher; each is forwarded as SIGTERM to the workers.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Fresh picks after a worker found its port taken (see above): a collision
# is rare, so three in a row mean something holds ports on purpose.
PORT_RETRIES = 3


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
      raise UserError(f"--worker_hosts entry {host!r} must be host:port with "
                     "a port in 1..65535.")
  if len(set(hosts)) != len(hosts):
    raise UserError(f"--worker_hosts={text!r} names an address twice; each "
                   "worker needs its own.")
  return hosts


def parse_codes(text: str) -> frozenset[int]:
  """Parses --retryable_codes "3,75" into {3, 75}; "" means none."""
  try:
    codes = frozenset(int(c) for c in text.split(",") if c.strip())
  except ValueError:
    raise UserError(f"--retryable_codes={text!r} must be comma-separated "
                   "integers, e.g. 75,76.") from None
  if any(not 0 < c < 256 for c in codes):
    raise UserError(f"--retryable_codes={text!r}: codes must be in 1..255.")
  return codes


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
  """Splits argv at the first `--` into (launcher options, worker command)."""
  if "--" not in argv:
    return argv, []
  split = argv.index("--")
  return argv[:split], argv[split + 1:]


def parse_args(argv=None, prog: str = PROG) -> argparse.Namespace:
  """Parses and checks the launcher's arguments.

  Returns:
    The options, plus `command` (the worker command), `hosts` (None with
    --num_workers: ports are picked per attempt), `codes` (the extra
    retryable exit codes) and `prog` (its lines' prefix).

  Raises:
    UserError: an argument is missing or malformed.
  """
  options, command = _split_command(
      list(sys.argv[1:] if argv is None else argv))
  p = Parser(prog=prog, allow_abbrev=False,
             usage="%(prog)s (--num_workers=N | --worker_hosts=H:P,"
             "... --task_index=I) [options] -- COMMAND ...",
             description=__doc__.splitlines()[0],
             epilog="Each worker's PATH begins with this Python's folder "
             f"({os.path.dirname(sys.executable)}), as an activated venv's "
             "does: a bare `python` in COMMAND is the launcher's own.")
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
    raise UserError(f"--task_index={args.task_index} must be in "
                   f"0..{len(args.hosts) - 1} for {len(args.hosts)} hosts.")
  args.host = args.host or "127.0.0.1"
  args.prog = prog
  return args


def _check(args: argparse.Namespace, command: list[str]) -> None:
  """Refuses option combinations argparse cannot express."""
  if not command:
    raise UserError("give the worker command after --, e.g. -- python -m "
                   "dist_keras.train --workdir=/tmp/run")
  if args.num_workers is not None and args.num_workers < 1:
    raise UserError(f"--num_workers={args.num_workers} must be >= 1.")
  if args.worker_hosts and args.task_index is None:
    raise UserError("--worker_hosts needs --task_index: which task runs here.")
  if args.worker_hosts and args.host:
    raise UserError("--host goes with --num_workers; --worker_hosts already "
                   "names the addresses.")
  if args.num_workers is not None and args.task_index is not None:
    raise UserError("--task_index goes with --worker_hosts; --num_workers "
                   "starts every task.")
  if args.grace_seconds < 0:
    raise UserError(f"--grace_seconds={args.grace_seconds} must be >= 0.")
  if args.max_restarts < 0:
    raise UserError(f"--max_restarts={args.max_restarts} must be >= 0.")


def _cluster_hosts(args) -> list[str]:
  """This attempt's addresses: the hand-made list, or fresh free ports."""
  if args.hosts:
    return args.hosts
  try:
    ports = free_ports(args.num_workers, args.host)
  except OSError as e:
    raise UserError(f"--host={args.host}: cannot bind a port there ({e}); "
                   "give an address of this machine.") from None
  return [f"{args.host}:{port}" for port in ports]


def _attempt(args, received, port_retry: int = 0):
  """Runs the cluster once; returns (index, exit status) of a failure, or
  None, and whether it was a port taken that `port_retry` (the number of
  this retry, 0: none left) starts again on fresh ports."""
  hosts = _cluster_hosts(args)
  indices = ([args.task_index] if args.hosts
             else list(range(args.num_workers)))
  cluster = Cluster(args.command, hosts, indices, args.grace_seconds,
                    received)
  try:
    cluster.start()
    failure = cluster.wait()
    taken = (cluster.port_taken(failure) if failure and port_retry
             and not args.hosts else None)
    if taken:
      say(args.prog, f"port {taken} of worker {failure[0]} was taken by "
          "another process after the launcher picked it; restarting every "
          f"worker on fresh ports ({port_retry}/{PORT_RETRIES})")
    elif failure and len(indices) > 1:
      say(args.prog, f"worker {failure[0]} exited with code {failure[1]}; "
          "stopping the others")
    elif failure:
      say(args.prog, f"worker {failure[0]} exited with code {failure[1]}")
    elif received:
      say(args.prog, f"got {signal.Signals(received[0]).name}; stopping the "
          "workers")
    return failure, bool(taken)
  finally:
    cluster.stop()


def run(args, received: list[int]) -> int:
  """Runs the cluster, restarting after retryable failures and after a port
  taken before its worker bound it; an exit status. `received`: the stop
  signals main()'s handler records, in order."""
  restarts = port_retries = 0
  while True:
    retry = port_retries + 1 if port_retries < PORT_RETRIES else 0
    try:
      failure, taken = _attempt(args, received, retry)
    except UserError as e:
      return fail(args.prog, e)
    except OSError as e:
      say(args.prog, f"cannot start {args.command[0]!r}: {e.strerror or e}")
      return EXIT_CANNOT_START
    if received:
      return 128 + received[0]
    if failure is None:
      return 0
    if taken:
      port_retries += 1
      continue
    index, code = failure
    if restarts == args.max_restarts or not is_retryable(code, args.codes):
      return code
    restarts += 1
    say(args.prog, f"restart {restarts}/{args.max_restarts} after worker "
        f"{index} exited with code {code}")


def main(argv=None, prog: str = PROG) -> int:
  """Runs the launcher on `argv` (default: the command line's); its exit
  status. `prog` names it in its usage and at the start of its lines."""
  try:
    args = parse_args(argv, prog)
  except UserError as e:
    return fail(prog, e)
  received = []
  # Record, don't raise: an exception mid-Popen could orphan a worker. An
  # ignored Ctrl-C or hangup (`cmd &`, nohup) stays ignored, as in a run.
  with signals.caught(lambda signum, _: received.append(signum),
                      STOP_SIGNALS, take_ignored=(signal.SIGTERM,)):
    return run(args, received)
