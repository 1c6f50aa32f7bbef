"""A multi-worker job's lost peer, read from the error TensorFlow raises
when one dies or stops answering: a PeerLost naming the task, retryable
(exit 200), for the command line and dist_keras.fit alike. No TensorFlow
import: the errors are told apart by their type's name."""
import re

from dist_keras import errors
from dist_keras.distribute import tfconfig

# What TensorFlow raises in a collective when a peer dies or stops
# answering (gRPC unavailable, coordination-service heartbeat timeout).
_PEER_ERRORS = ("UnavailableError", "AbortedError", "CancelledError",
                "DeadlineExceededError")
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
# A remote file system's error names its URL or HTTP (gs://, s3://: a
# checkpoint's save timing out there is no peer's doing); a peer's names a
# task, or only the socket it lost (gRPC's "dns:///worker-1:2222" too).
_REMOTE_STORAGE = re.compile(
    r"\b(?:gs|s3|hdfs|az|abfss?|https?)://|\bHTTP request", re.IGNORECASE)


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
