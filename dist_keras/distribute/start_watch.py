"""While TensorFlow's collective runtime starts (MultiWorkerMirroredStrategy's
construction, after rendezvous.py saw every peer's port answer): a watch in
a process of its own ends this one, with its line, if a peer stops
listening or the start outlasts runtime.peer_start_timeout_seconds.

Why: the service's leader (worker 0, or the chief) waits in that call until
every task has registered, with no deadline (TF 2.21: its
cluster_register_timeout_in_ms bounds the others' registration only; a
leader whose peer was seen and then never started waited >240 s, silent),
and the call holds the interpreter: no Python thread runs, SIGTERM is
TensorFlow's and only recorded. What got there: a peer that ended (or was
restarted) between being seen and starting its runtime, or another
process listening at a peer's address. Only another process can act then,
and only by SIGKILL: the run ends killed (exit 137, retryable as any exit
>= 128: a launcher or Kubernetes restarts it), after the watch has said
why. Nothing has been written yet: the workdir comes after the strategy.
"""
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from dist_keras import terminal
from dist_keras.distribute import peers
from dist_keras.distribute import rendezvous

# A peer whose port has refused connections this long stopped listening:
# not the moment between its placeholder's close and TensorFlow's server
# taking the port (well under a second, seconds on a loaded machine).
LOST_SECONDS = 10.0
PROBE_SECONDS = 0.5
PROGRESS_SECONDS = 30.0
_RERUN = ("nothing was written; rerun the job on every worker (python -m "
          "dist_keras.launch --max_restarts does)")


@contextlib.contextmanager
def watched(me: str, waiting: dict, timeout_seconds: float):
  """Runs the block (TensorFlow's start) watched by a process that kills
  this one if a task of `waiting` ({"worker:1": "host:port"}) stops
  listening, or the block lasts over `timeout_seconds` (0: no limit). The
  watch ends as the block does (its stdin closes), and with this process."""
  terminal.flush()  # (The watch writes to the same stdout and stderr.)
  package = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  watch = subprocess.Popen(
      [sys.executable, "-m", __name__, json.dumps(
          [os.getpid(), me, waiting, timeout_seconds])],
      stdin=subprocess.PIPE, env=dict(
          os.environ, PYTHONPATH=os.pathsep.join(
              filter(None, [package, os.environ.get("PYTHONPATH")]))))
  try:
    yield
  finally:
    watch.stdin.close()  # "Started": it ends.
    watch.wait()


def verdict(me: str, waiting: dict, refused_since: dict, waited: float,
            timeout_seconds: float) -> str | None:
  """The watch's error line, or None while the start may go on.

  Args:
    me: this task ("worker:0").
    waiting: the other tasks' addresses.
    refused_since: seconds each task's port has refused connections
      (absent: it answers, or cannot be told).
    waited: seconds since TensorFlow's start began.
    timeout_seconds: runtime.peer_start_timeout_seconds (0: no limit).
  """
  lost = [t for t, seconds in refused_since.items() if seconds >= LOST_SECONDS]
  if lost:
    return (f"{me} lost {lost[0]} at {waiting[lost[0]]} as TensorFlow's "
            "collective runtime started: it stopped listening after it was "
            f"seen (its process ended, or was restarted); this process is "
            f"ended (SIGKILL, exit 137: TensorFlow's wait cannot be "
            f"interrupted); {_RERUN}.")
  if timeout_seconds and waited >= timeout_seconds:
    return (f"{me}: TensorFlow's collective runtime did not start within "
            f"{waited:.0f} s after every other task's port answered "
            f"({rendezvous.listed(waiting)}): a "
            "task that ended or hung after it was seen, or another process "
            "listening at its address (read each task's log); this process "
            "is ended (SIGKILL, exit 137: TensorFlow's wait cannot be "
            f"interrupted); {_RERUN}, or raise "
            "runtime.peer_start_timeout_seconds (0: no limit).")
  return None


def _watch(pid: int, me: str, waiting: dict, timeout_seconds: float,
           probe=peers.listening, every: float = PROGRESS_SECONDS) -> None:
  """Probes the peers until stdin closes (the start is over, or the
  process it watches has ended), saying every `every` seconds that it
  still waits, else says the verdict and kills `pid`."""
  start = said = time.monotonic()
  refused_at = {}
  while not select.select([sys.stdin], [], [], PROBE_SECONDS)[0]:
    now = time.monotonic()
    for task, address in waiting.items():
      if probe(address) is False:
        refused_at.setdefault(task, now)
      else:
        refused_at.pop(task, None)
    line = verdict(me, waiting, {t: now - at for t, at in refused_at.items()},
                   now - start, timeout_seconds)
    if line is not None:
      terminal.error(line)
      terminal.flush()
      os.kill(pid, signal.SIGKILL)
      return
    if now - said >= every:
      said = now
      terminal.say(f"dist_keras: {me} still waits for TensorFlow's "
                   f"collective runtime to start on every task "
                   f"({now - start:.0f} s)")


if __name__ == "__main__":
  # Ctrl-C reaches the terminal's whole process group: it is the run's to
  # take (once TensorFlow's start returns), not a traceback of the watch's.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _watch(*json.loads(sys.argv[1]))
