"""A lost peer (distribute/peers.py): TensorFlow's error when a worker dies
becomes a retryable PeerLost naming the task, from the command line and
from dist_keras.fit alike."""
import json
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
