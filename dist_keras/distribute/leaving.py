"""How the workers of a finished multi-worker run leave: together, and the
chief last.

TensorFlow's coordination service runs in the chief and expects a
heartbeat from every task until its process ends; nothing in TensorFlow
takes a task out of it when the task is done. Workers that left one by one,
through Python's exit, made successful runs end with TensorFlow's error
lines: the chief, still writing its results (or destroying an input
iterator, seconds) past the heartbeat timeout after a worker had gone,
printed "The tasks have crashed"; a worker outliving the chief printed
"Failed to send RPC to coordination service" at its next heartbeat. So
every worker waits at a barrier until all have finished (the chief's
results written), the others then exit at once (os._exit, the caller's),
and the chief waits until their processes have ended before it exits: until
nothing listens at their addresses (TensorFlow's server holds its port to
its process's end). A word each sent the chief as it left would not do: the
service's answer to it is lost when the chief exits first, and the worker
then fails.

TensorFlow has no public API for the barrier: its own preemption handler
(tf.distribute.experimental.PreemptionCheckpointHandler) uses the same
`context.context()` calls.
"""
import socket
import time

from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from dist_keras import terminal
from dist_keras.distribute import tfconfig

BARRIER = "dist_keras/finished"
# A worker waits this long for the others to finish: the chief writes
# model.keras and summary.json after the last collective (seconds, more to
# remote storage). A peer that died fails the barrier sooner: at once for
# the chief, in ~10 s (the service's heartbeat timeout) for another.
FINISH_SECONDS = 600
# The chief waits this long for the others' processes to end after the
# barrier (measured: 0.04-0.12 s on loopback); a task it cannot reach (a
# firewall dropping its probes) does not hold it longer.
LEAVE_SECONDS = 30
_PROBE_SECONDS = 0.01


def together(cluster: tfconfig.ClusterSpec) -> None:
  """Returns once every worker has finished the run and, on the chief,
  once every other worker's process has ended; the caller exits at once.

  Raises:
    tf.errors.OpError: a peer failed, died or did not finish in time.
  """
  context.context().wait_at_barrier(BARRIER, FINISH_SECONDS * 1000)
  if not cluster.is_chief:
    return
  others = {f"{task_type}:{index}": address
            for task_type, addresses in cluster.cluster.items()
            for index, address in enumerate(addresses)
            if address != cluster.address}
  deadline = time.monotonic() + LEAVE_SECONDS
  while others and time.monotonic() < deadline:
    others = {task: address for task, address in others.items()
              if listening(address)}
    if others:
      time.sleep(_PROBE_SECONDS)
  for task, address in others.items():
    terminal.say(f"dist_keras: {task} ({address}) still answers "
                 f"{LEAVE_SECONDS} s after the run finished; the chief "
                 "leaves without waiting for it", err=True)


def listening(address: str) -> bool:
  """Whether a process still listens at "host:port" (or one cannot tell:
  it did not answer within a second)."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
      return True
  except (ConnectionRefusedError, socket.gaierror):  # Gone, host and all.
    return False
  except OSError:
    return True
