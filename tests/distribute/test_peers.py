"""A lost peer (distribute/peers.py): TensorFlow's error when a worker dies
becomes a retryable PeerLost naming the task, from the command line and
from dist_keras.fit alike."""
import json
import os
import types

import helpers
import pytest
import tensorflow as tf
import user_task

import dist_keras
from dist_keras import errors
from dist_keras.distribute import peers
from dist_keras.training import loop

_MESSAGE = ("Graph execution error:\n\nDetected at node X defined at:\n"
            "  File a.py\n\nCollective ops is aborted by: Socket closed\n"
            "Additional GRPC error information from remote target "
            "/job:worker/replica:0/task:1 while calling RecvBuf:\n"
            "\t [[{{node X}}]]")


def test_peer_errors_become_a_retryable_peer_lost_naming_the_task(
    monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
      "task": {"type": "worker", "index": 0}}))
  lost = peers.lost(tf.errors.UnavailableError(None, None, _MESSAGE))
  assert lost.exit_code == errors.EXIT_PEER_LOST >= 128
  assert str(lost).startswith(
      "lost contact with task worker:1 (UnavailableError: Collective ops is "
      "aborted by: Socket closed)")
  # Not a peer error, or not multi-worker: not retryable.
  assert peers.lost(ValueError(_MESSAGE)) is None
  monkeypatch.delenv("TF_CONFIG")
  assert peers.lost(tf.errors.UnavailableError(None, None, _MESSAGE)) is None


def test_fit_raises_peer_lost_as_its_docstring_says(tmp_path, monkeypatch):
  """It raised TensorFlow's own UnavailableError (only the command line
  turned it into PeerLost)."""
  def peer_dies(self):
    raise tf.errors.UnavailableError(None, None, _MESSAGE)

  monkeypatch.setattr(loop.Trainer, "run", peer_dies)
  monkeypatch.setattr(peers, "tfconfig", types.SimpleNamespace(
      from_env=lambda: types.SimpleNamespace(task_type="worker",
                                             task_index=0)))
  with pytest.raises(dist_keras.errors.PeerLost,
                     match="lost contact with task worker:1"):
    helpers.fit_fns(user_task.model_fn, user_task.dataset_fn, tmp_path,
                    {"train.steps": 2, "train.global_batch_size": 48})


@pytest.mark.parametrize("message, named", [
    (_MESSAGE, "task worker:1"),
    ("Collective ops is aborted by: Socket closed", "a peer task"),
    ("DNS resolution failed for dns:///worker-1:2222", "a peer task"),
    (("Error executing an HTTP request: HTTP response code 503 with body "
      "'...' when initiating an upload to gs://bucket/run/ckpt-2_temp/part"),
     "remote storage"),
    ("All 10 retry attempts failed. s3://bucket/run/ckpt-2.index",
     "remote storage"),
])
def test_an_unavailable_remote_storage_is_not_called_a_peer(message, named):
  """A checkpoint's save timing out on gs:// or s3:// under a cluster was
  'lost contact with a peer task': the user looked for a dead worker."""
  cluster = types.SimpleNamespace(task_type="worker", task_index=0)
  error = tf.errors.DeadlineExceededError(None, None, message)
  assert peers.who(error, cluster) == named


# How a collective fails on worker 0 once worker 1 reported its own error
# (reports.report; TF 2.21, 2 processes): by the coordination service's
# word, or (2 runs of 5) by its receive from worker 1, whose own
# collectives the report aborted, with gRPC's copy of the text.
_SERVICE = ("Graph execution error:\n\nDetected at node CollectiveReduceV2 "
            "defined at (most recent call last):\n  File a.py\n\n"
            "Collective ops is aborted by: Error reported from "
            "/job:worker/task:1: {text}\nThe error could be from a previous "
            "operation. Restart your program to reset.\n"
            "\t [[{{{{node CollectiveReduceV2}}}}]] [Op:__inference_step_9]")
_RECEIVE = ("Graph execution error:\n\nDetected at node CollectiveReduceV2 "
            "defined at (most recent call last):\n  File a.py\n\n"
            "Collective ops is aborted by: Collective ops is aborted by: "
            "{text}\nThe error could be from a previous operation. Restart "
            "your program to reset.\nAdditional GRPC error information from "
            "remote target /job:worker/replica:0/task:1 while calling "
            "/tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received "
            "from peer  {{grpc_status:9, grpc_message:\"Collective ops is "
            "aborted by: {text}\\nThe error could be from a previous "
            "operation.\"}} [type.googleapis.com/tensorflow.DerivedStatus='']"
            "\n\t [[{{{{node CollectiveReduceV2}}}}]] [Op:__inference_step_9]")
_WORKER_1 = types.SimpleNamespace(task_type="worker", task_index=1)


@pytest.fixture(name="worker_0")
def _worker_0(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
      "task": {"type": "worker", "index": 0}}))


def _failed(shape, error):
  """worker 0's collective's error once worker 1 reported `error`."""
  return tf.errors.FailedPreconditionError(None, None, shape.format(
      text=peers.report_text(error, _WORKER_1)))


@pytest.mark.parametrize("shape", [_SERVICE, _RECEIVE])
@pytest.mark.parametrize("error, code", [
    (errors.UserError("dataset_fn('train', ...) ran out of batches at step "
                      "1; repeat it (ds.repeat())."), errors.EXIT_CONFIG_ERROR),
    (errors.Diverged("loss nan at step 3: training diverged."),
     errors.EXIT_DIVERGED)])
def test_a_peers_reported_error_is_its_line_naming_it_with_its_exit_code(
    worker_0, shape, error, code):
  """Worker 0 said 'lost contact with task worker:1 ...; the job must
  restart' (exit 200, retryable) when worker 1 refused its own data: a
  restart fails alike, and the cause was on worker 1's stderr only."""
  stopped = peers.stopped(_failed(shape, error))
  assert isinstance(stopped, errors.UserError)  # What fit's callers catch.
  assert str(stopped) == f"worker:1 stopped the job: {error}"
  assert stopped.exit_code == code and code in errors.PERMANENT
  assert peers.lost(_failed(shape, error)) is None  # (Not a lost peer's.)
  # As TensorFlow logs the status, its payload after the line.
  logged = (f"StartAbort FAILED_PRECONDITION: Error reported from /job:"
            f"worker/task:1: {peers.report_text(error, _WORKER_1)} [type."
            "googleapis.com/tensorflow.CoordinationServiceError='\\x18']")
  assert str(peers.stopped(ValueError(logged))) == str(stopped)


def test_only_a_dist_keras_report_is_a_peers_stop(worker_0, monkeypatch):
  """TensorFlow's own reports (a peer's missed heartbeats) stay a lost
  peer; outside a cluster nothing is a peer's."""
  heartbeats = tf.errors.UnavailableError(None, None, _SERVICE.format(
      text="The following tasks are unhealthy (stopped sending heartbeats):"))
  assert peers.stopped(heartbeats) is None
  assert str(peers.lost(heartbeats)).startswith("lost contact with ")
  reported = _failed(_SERVICE, errors.UserError("bad"))
  assert peers.stopped(reported) is not None
  monkeypatch.delenv("TF_CONFIG")
  assert peers.stopped(reported) is None


def test_fit_raises_the_peers_refusal_as_a_user_error(tmp_path, monkeypatch):
  """The run stops with the peer's line and exit code; a refusal before
  the first checkpoint leaves no workdir, as on the worker that refused."""
  def peer_refuses(self):
    raise _failed(_SERVICE, errors.UserError("bad data on worker 1."))

  monkeypatch.setattr(loop.Trainer, "run", peer_refuses)
  monkeypatch.setattr(peers, "tfconfig", types.SimpleNamespace(
      from_env=lambda: types.SimpleNamespace(task_type="worker",
                                             task_index=0)))
  with pytest.raises(errors.StoppedByPeer) as raised:
    helpers.fit_fns(user_task.model_fn, user_task.dataset_fn,
                    tmp_path / "run",
                    {"train.steps": 2, "train.global_batch_size": 48})
  assert str(raised.value) == "worker:1 stopped the job: bad data on worker 1."
  assert raised.value.exit_code == errors.EXIT_CONFIG_ERROR
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("message", [
    # Longer than errors.first_line's 240 by default: a peer said less
    # than the worker itself if cut there.
    "a batch holds a value the model cannot take (" + "x" * 600 + ").",
    # Its first line blank: the report was "stopped the job (exit 2): "
    # with nothing after it, which no peer read as a report (a lost peer).
    "\ndataset_fn('train', ...) gave no batches;  fix   it.",
])
def test_a_peers_line_is_the_line_the_worker_says_itself(worker_0, message):
  """One helper makes the line the worker says (train.py) and the one it
  reports (errors.first_line, uncut)."""
  error = errors.UserError(message)
  said = errors.first_line(error, limit=None)
  assert said and "\n" not in said and "  " not in said
  assert len(said) == len(" ".join(message.split()))
  stopped = peers.stopped(_failed(_SERVICE, error))
  assert str(stopped) == f"worker:1 stopped the job: {said}"


def test_a_task_the_service_names_without_its_replica_is_named():
  """The coordination service names a reporting task as "/job:worker/
  task:1" (TF 2.21, 2 workers: worker 0's collective or barrier once
  worker 1 reported an error of TensorFlow's, not dist_keras'): it was
  'a peer task'."""
  cluster = types.SimpleNamespace(task_type="worker", task_index=0)
  error = tf.errors.UnavailableError(None, None, _SERVICE.format(
      text="Socket closed"))
  assert peers.who(error, cluster) == "task worker:1"
  me = tf.errors.UnavailableError(None, None, "Error reported from "
                                  "/job:worker/task:0: mine")
  assert peers.who(me, cluster) == "a peer task"  # (Itself: not a peer.)
