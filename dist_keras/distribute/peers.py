"""A multi-worker job's lost peer, read from the error TensorFlow raises
when one dies or stops answering: a PeerLost naming the task, retryable
(exit 200), for the command line and dist_keras.fit alike; and a peer's
own one-line error, which it reported to the cluster (reports.report) and
TensorFlow's collectives here fail with: a StoppedByPeer with its line
and exit code (a UserError's, or an error a user's function raised); and
whether a peer's process still listens at its address (`listening`). No
TensorFlow import: the errors are told apart by their type's name and
text."""
import errno
import re
import socket

from dist_keras import errors, origins
from dist_keras.distribute import tfconfig

# What TensorFlow raises in a collective when a peer dies or stops
# answering (gRPC unavailable, coordination-service heartbeat timeout).
_PEER_ERRORS = ("UnavailableError", "AbortedError", "CancelledError",
                "DeadlineExceededError")
# (The coordination service names a task without its replica: "Error
# reported from /job:worker/task:1".)
_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# A remote file system's error names its URL or HTTP (gs://, s3://: a
# checkpoint's save timing out there is no peer's doing); a peer's names a
# task, or only the socket it lost (gRPC's "dns:///worker-1:2222" too).
_REMOTE_STORAGE = re.compile(
    r"\b(?:gs|s3|hdfs|az|abfss?|https?)://|\bHTTP request", re.IGNORECASE)


# What reports.report tells the others. A peer's collective fails with it
# as "Error reported from /job:worker/task:1: TEXT" (the coordination
# service's word), or as "Collective ops is aborted by: TEXT" (its receive
# from the reporting worker, whose own collectives the report aborted,
# when that answered first: 2 runs of 5 on 2 local workers).
_STOPPED = "dist_keras: {task} stopped the job (exit {code}): {line}"
# (A status's text as TensorFlow logs it ends in its payload, "[type.
# googleapis.com/...]"; the first match is the message's own line, before
# gRPC's copy of it.)
_REPORTED = re.compile(r"dist_keras: (\w+:\d+) stopped the job \(exit (\d+)\): "
                       r"(.+?)(?: \[type\.googleapis\.com/.*)?$", re.MULTILINE)


def report_text(error: Exception, cluster) -> str:
  """What a worker whose own `error` stops the job tells the others: its
  line as it says it itself (train.py), uncut (a peer's line is the same;
  measured on 2 local workers, a report of 50,000 characters reached the
  peer's collective whole). A user's function's own error (not a
  UserError: origins.users_own) is said as train.py says it, exit 1,
  without its hint to rerun with --verbose (the traceback is that
  worker's)."""
  if isinstance(error, errors.UserError):
    code, line = error.exit_code, errors.first_line(error, limit=None)
  else:
    code, line = errors.EXIT_UNEXPECTED, origins.unexpected(error)
  return _STOPPED.format(task=f"{cluster.task_type}:{cluster.task_index}",
                         code=code, line=line)


def stopped(error: Exception):
  """A StoppedByPeer for a multi-worker job's error that a peer's report
  (report_text) caused, else None: "worker:1 stopped the job: LINE", with
  that worker's exit code."""
  found = _REPORTED.search(str(error))
  if found is None or tfconfig.from_env() is None:
    return None
  task, code, line = found.groups()
  return errors.StoppedByPeer(f"{task} stopped the job: {line}", int(code))


def lost(error: Exception):
  """A PeerLost for a multi-worker job's lost-peer error, else None."""
  cluster = tfconfig.from_env()  # Checked at start-up: parses cleanly.
  if type(error).__name__ not in _PEER_ERRORS or cluster is None:
    return None
  return errors.PeerLost(
      f"lost contact with {who(error, cluster)} ({type(error).__name__}: "
      f"{errors.cause(str(error))}); the job must restart: rerun it on "
      "every worker (python -m dist_keras.launch --max_restarts does) to "
      "resume from the last checkpoint.")


def who(error: Exception, cluster) -> str:
  """The first other task `error` names ("task worker:1"), else "remote
  storage" for a remote file system's error, else "a peer task"."""
  me = (cluster.task_type, cluster.task_index)
  others = [m for m in _TASK.finditer(str(error))
            if (m.group(1), int(m.group(2))) != me]
  if others:
    return f"task {others[0].group(1)}:{others[0].group(2)}"
  return ("remote storage" if _REMOTE_STORAGE.search(str(error))
          else "a peer task")


# A connect's errors that say nothing listens there any more: refused, or
# its host gone (a pod deleted after it left).
_GONE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
         errno.EHOSTDOWN)


def listening(address: str) -> bool | None:
  """Whether a process still listens at "host:port": True, False, or None
  when one cannot tell (no answer within a second: a firewall dropping the
  probe)."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
      return True
  except socket.gaierror:  # The host's name is gone.
    return False
  except OSError as e:
    return False if e.errno in _GONE else None
