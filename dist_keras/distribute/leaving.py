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

The command line leaves at its end (train.py) and exits with os._exit.
`dist_keras.fit`, a library's call, does neither to its caller's process:
a cluster run that finished arms `at_exit`, and its workers leave together
as their interpreters exit, whatever their scripts did after fit.

Workers that stop early meet too before they leave, for the same reason
(a peer still receiving the last collective's ring step when one left):
after a refusal or a divergence (`met`), and after a stop request's
checkpoint, briefly (`met_to_stop`).

A worker whose own one-line error (a UserError: its data refused) stops
the job tells the others before it leaves (reports.py): a peer waiting
here then says its line (reports.stopped), not that it lost a worker.

TensorFlow has no public API for the barrier: its own
preemption handler (tf.distribute.experimental.PreemptionCheckpointHandler)
uses the same `context.context()` calls.
"""
import atexit
import dataclasses
import sys
import time

import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from dist_keras import errors, terminal
from dist_keras.distribute import peers, reports, tfconfig

BARRIER = "dist_keras/finished"
REFUSED = "dist_keras/refused"
STOPPED = "dist_keras/stopped"
# Workers stopping for a SIGTERM meet (met_to_stop) this long at most: a
# preempted peer may be gone already (the platform kills it after its
# grace period, 30 s by default on Kubernetes, which the checkpoint's save
# shares), and a meeting it cannot come to must not hold the others. Each
# comes once its part of the step's checkpoint is saved (2 local workers:
# within 0.11 s of each other). The chief gone fails it at once (the
# service runs there); another worker gone, at the timeout.
STOP_SECONDS = 5
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
  answers = dict.fromkeys(others, True)
  while answers and time.monotonic() < deadline:
    answers = {task: answer for task in answers
               if (answer := peers.listening(others[task])) is not False}
    if answers:
      time.sleep(_PROBE_SECONDS)
  for task, answer in answers.items():
    state = "still answers" if answer else "could not be reached"
    terminal.say(f"dist_keras: {task} ({others[task]}) {state} "
                 f"{LEAVE_SECONDS} s after the run finished; the chief "
                 "leaves without waiting for it", err=True)


def met(barrier: str, seconds: float = 60) -> None:
  """Returns once every worker has come to `barrier` (the coordination
  service's, not a collective): workers that all refuse a run after a
  collective meet here first. One that left at once could close its
  channel while a peer still received its part of the collective's last
  ring step (TF's "Aborting RingReduce ... Socket closed"; the peer then
  reported a lost worker)."""
  context.context().wait_at_barrier(barrier, int(seconds * 1000))


def refused_together(error: errors.UserError) -> errors.UserError:
  """`error`, once every worker has come to REFUSED (`met`): they all
  raise it, refusing the run on a collective's sum, so none reports it."""
  met(REFUSED)
  error.every_worker = True
  return error


def met_to_stop() -> None:
  """Returns once every worker has come here after the step they agreed
  to stop at (a SIGTERM's or Ctrl-C's, its checkpoint saved), or after
  STOP_SECONDS, or at once when the chief is gone: the caller then exits
  (143 or 130) whatever happened here. One that left right after the
  agreement's all-reduce could close its channel while a peer still
  received the ring's last step (the peer then exited 200, a lost worker,
  not 143)."""
  try:
    met(STOPPED, STOP_SECONDS)
  except tf.errors.OpError as e:
    # A preempted peer killed after its grace period, or still saving: the
    # stop is clean all the same.
    cluster = tfconfig.from_env()
    who = peers.who(e, cluster) if cluster else "a peer task"
    stop = reports.stopped(e)  # (A peer's own error, which it reported.)
    terminal.say(
        f"dist_keras: {stop}; this worker stops alone." if stop else
        f"dist_keras: {who} did not meet this worker as it stopped "
        f"({type(e).__name__}: {errors.cause(str(e))}); it stops alone.",
        err=True)


@dataclasses.dataclass
class _AtExit:
  """What the process does as its interpreter exits.

  Attributes:
    cluster: leave `together` with it; None: leave alone.
    registered: leave_at_exit is in atexit's registry (once a process).
    last_error: sys.last_value when armed: another one at exit is the
      script's own uncaught error (or Ctrl-C).
  """
  cluster: tfconfig.ClusterSpec | None = None
  registered: bool = False
  last_error: BaseException | None = None


_AT_EXIT = _AtExit()


def at_exit(cluster: tfconfig.ClusterSpec | None) -> None:
  """Arms (a cluster) or disarms (None) leaving `together` as this
  process's interpreter exits: `dist_keras.fit`'s, armed by a cluster run
  that finished, disarmed by one that failed (its peers may never come to
  the barrier, where it would wait FINISH_SECONDS for them)."""
  if cluster is not None and not _AT_EXIT.registered:
    # atexit calls its handlers before the interpreter tears its modules
    # down, TensorFlow's runtime with them (TensorFlow registers none of
    # its own; TF 2.21), last registered first: the caller's from before
    # fit run after this one.
    atexit.register(leave_at_exit)
    _AT_EXIT.registered = True
  _AT_EXIT.cluster = cluster
  _AT_EXIT.last_error = getattr(sys, "last_value", None)


def leave_at_exit() -> None:
  """atexit's handler: `together`, unless the script ended in an uncaught
  error or Ctrl-C. Such a process leaves at once, as Python's would: the
  barrier's call holds the interpreter (no Python thread or signal handler
  runs until it returns; checked on TF 2.21), so a Ctrl-C could not end
  the wait (up to FINISH_SECONDS, for a peer whose script goes on)."""
  cluster = _AT_EXIT.cluster
  if cluster is None or getattr(sys, "last_value", None) is not (
      _AT_EXIT.last_error):
    return
  try:
    together(cluster)
  except KeyboardInterrupt:  # Pressed while it waited: it is leaving.
    pass
  except tf.errors.OpError as e:
    # A peer's script failed or it died after its run had finished, or it
    # outlasted FINISH_SECONDS: one line, no traceback; the exit code is
    # the script's.
    stop = reports.stopped(e)
    terminal.say(
        f"dist_keras: {stop}; this worker's run had finished: it leaves "
        "alone." if stop else
        f"dist_keras: {peers.who(e, cluster)} did not leave together with "
        f"this worker at exit ({type(e).__name__}: {errors.cause(str(e))}); "
        "this worker's run had finished: it leaves alone.", err=True)
