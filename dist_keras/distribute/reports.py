"""A worker's own one-line error, told to the other workers of its cluster.

A worker whose own one-line error (a UserError: its data refused; or an
error its user's function raised, e.g. a RuntimeError in dataset_fn:
origins.users_own) stops the job tells the others before it leaves
(`report`): their collectives
then fail with its line (peers.stopped), not as if it had died. A peer
that is at a barrier of the coordination service when the report comes
(leaving.together, leaving.met) fails there with the line too; one that
comes to it after the report fails with TensorFlow's "Agent must be in
CONNECTED state. It is currently in ERROR." alone, so the report's text is
kept in the service too, where `stopped` reads it back (a key's read still
answers in that state; TF 2.21). The service runs in the chief's process
and dies with it: a chief that reported waits (`_until_told`, at most
TOLD_SECONDS) until every other worker has its line (`_told`: a key each
puts once it has) or has ended, before it goes on to leave; a peer that
came to a barrier after the chief had exited said it had lost contact
(exit 200, retryable), not the chief's line.

TensorFlow has no public API for the report: its own preemption handler
(tf.distribute.experimental.PreemptionCheckpointHandler) uses the same
`context.context()` calls.
"""
import time

import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from dist_keras import errors, origins, quiet
from dist_keras.distribute import peers, tfconfig

# The key each worker of a cluster puts in the coordination service as
# soon as it can (`joined`: as its strategy starts, or as fit is given
# one), which `report` reads back, in a deadline, before it reports: the
# report's own call has none (TF 2.21), and holds the interpreter as long
# as a hung chief (the service's host) does (measured: until it was killed,
# 56 s); a live service answers at once.
_JOINED = "dist_keras/joined/"
_PROBE_MS = 2000
# Where a report's text is kept (the first report's: `stopped` says it).
_REPORTED = "dist_keras/reported"
# What a call of the service says once a report has come to this worker.
_IN_ERROR = "Agent must be in CONNECTED state"
# What TensorFlow logs (fd 2) as the report aborts this worker's own
# collectives: the line this worker is about to say.
_ABORT_LINE = ("BaseCollectiveExecutor::StartAbort",)
# The key each worker puts once it has a report's line (`_told`): from its
# collective's error, or from _REPORTED, or its own report.
_TOLD = "dist_keras/told/"
# A chief that reported waits this long at most for the others to have its
# line, or to have ended (a peer that died: at once, nothing listens at its
# address): one at a barrier reads it back in a moment; one still busy
# (an eval, a checkpoint's save) past this says it lost contact, as before.
TOLD_SECONDS = 5
# How long one look for a peer's _TOLD key waits (the read has a deadline,
# no "is it there" of its own).
_LOOK_MS = 50
# The keys this process has put (`joined`): one that has not cannot be
# probed, and reports nothing rather than wait _PROBE_MS for its key.
_JOINED_HERE = set()


def joined(cluster: tfconfig.ClusterSpec | None) -> None:
  """Marks this worker of a multi-worker run as started, for `report`."""
  if not tfconfig.is_multi_worker(cluster) or not _has_service():
    return
  try:
    context.context().set_config_key_value(_key(cluster), "1")
  except tf.errors.AlreadyExistsError:  # This process's earlier fit.
    pass
  _JOINED_HERE.add(_key(cluster))


def report(error: BaseException, cluster) -> None:
  """Tells the cluster's other workers that `error`, this worker's own
  one-line error (a UserError no other raised with it, or an error a
  user's function raised: origins.users_own), stops the job: their
  collectives fail with its line (peers.stopped). Only where a
  coordination service runs and answers; a report that fails is ignored
  (the others then lose this worker, as before)."""
  if (not _own(error) or not tfconfig.is_multi_worker(cluster)
      or not _has_service()
      or _key(cluster) not in _JOINED_HERE):
    return
  text = peers.report_text(error, cluster)
  try:
    context.context().get_config_key_value(_key(cluster), _PROBE_MS)
    try:
      context.context().set_config_key_value(_REPORTED, text)
    except tf.errors.AlreadyExistsError:  # Another worker's came first.
      pass
    with quiet.startup_lines_filtered(noise=_ABORT_LINE):
      context.context().report_error_to_cluster(
          tf.errors.FAILED_PRECONDITION, text)
  except Exception:  # pylint: disable=broad-except
    return  # No service, or none answering: it leaves unreported.
  _told(cluster)  # (Another's report needs no reading back here.)
  if cluster.is_chief:
    _until_told(cluster)


def _own(error: BaseException) -> bool:
  """Whether `error` is this worker's own to tell: a UserError no other
  raised with it, or a user's function's own error (its peers said 'lost
  contact', exit 200, 16-32 s later: a restart met it again)."""
  if isinstance(error, errors.UserError):
    return not error.every_worker
  return origins.users_own(error)


def stopped(error: Exception):
  """peers.stopped(error); for an error of the service that says only
  that a report came before the call (a barrier's), the StoppedByPeer of
  the report's text, read back in a deadline; else None."""
  found = peers.stopped(error)
  if found is None and _IN_ERROR in str(error) and _has_service():
    try:
      found = peers.stopped(
          context.context().get_config_key_value(_REPORTED, _PROBE_MS))
    except Exception:  # pylint: disable=broad-except
      return None  # No report (a peer lost), or no service answering.
  if found is not None:
    _told(tfconfig.from_env())  # The reporting chief may leave now.
  return found


def _told(cluster) -> None:
  """Puts this worker's _TOLD key: it has a report's line, for a chief
  that reported and waits for it (`_until_told`); a chief already gone
  fails the put at once (connection refused), which is ignored."""
  if not tfconfig.is_multi_worker(cluster) or not _has_service():
    return
  try:
    # A read of the report in a deadline first: the put has none, and
    # would hold the interpreter as long as a hung chief (see _JOINED).
    context.context().get_config_key_value(_REPORTED, _PROBE_MS)
    context.context().set_config_key_value(_TOLD + _name(cluster), "1")
  except Exception:  # pylint: disable=broad-except
    pass  # Put before (a second error), or no service any more.


def _until_told(cluster: tfconfig.ClusterSpec) -> None:
  """Returns once every other worker of `cluster` has put its _TOLD key
  or its process has ended, or after TOLD_SECONDS: the chief, whose
  process holds the service (and _REPORTED), leaves after that."""
  others = {f"{task_type}:{index}": address
            for task_type in ("chief", "worker")  # The service's tasks.
            for index, address in enumerate(cluster.cluster.get(task_type, ()))
            if address != cluster.address}
  deadline = time.monotonic() + TOLD_SECONDS
  while others and time.monotonic() < deadline:
    others = {task: address for task, address in others.items()
              if not _has_key(_TOLD + task)
              and peers.listening(address) is not False}


def _has_key(key: str) -> bool:
  """Whether the service holds `key`, looked for _LOOK_MS."""
  try:
    context.context().get_config_key_value(key, _LOOK_MS)
    return True
  except Exception:  # pylint: disable=broad-except
    return False  # Not (yet) put.


def _has_service() -> bool:
  """Whether this process's TensorFlow has a coordination service."""
  return context.context().coordination_service is not None


def _key(cluster: tfconfig.ClusterSpec) -> str:
  return _JOINED + _name(cluster)


def _name(cluster: tfconfig.ClusterSpec) -> str:
  return f"{cluster.task_type}:{cluster.task_index}"
