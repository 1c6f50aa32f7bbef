"""distribute/leaving.py: a finished cluster's workers meet at a barrier,
then the others exit and the chief waits until their processes have ended
(on a real cluster: tests/distribute/test_multi_worker.py)."""
import socket
import threading
import time

import pytest

from dist_keras.distribute import leaving, tfconfig


class _Service:
  """The coordination service's barrier, its calls recorded."""

  def __init__(self):
    self.calls = []

  def wait_at_barrier(self, barrier, timeout_ms):
    self.calls.append((barrier, timeout_ms))


@pytest.fixture(name="service")
def _service(monkeypatch):
  service = _Service()
  monkeypatch.setattr(leaving.context, "context", lambda: service)
  return service


def _listener():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  return server, f"127.0.0.1:{server.getsockname()[1]}"


_BARRIER = [(leaving.BARRIER, leaving.FINISH_SECONDS * 1000)]


@pytest.mark.parametrize("task_type,index", [("worker", 1), ("worker", 0)])
def test_a_worker_leaves_once_every_worker_has_finished(
    service, monkeypatch, task_type, index):
  """At once, without waiting for anyone (worker 0 is no chief beside a
  chief)."""
  monkeypatch.setattr(leaving, "listening", pytest.fail)
  cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
  leaving.together(tfconfig.ClusterSpec(cluster, task_type, index))
  assert service.calls == _BARRIER


def test_the_chief_leaves_once_the_others_processes_have_ended(service):
  """The service runs in the chief: a worker outliving it fails its next
  heartbeat, and it reports one gone 10 s before it as crashed."""
  servers, addresses = zip(*[_listener() for _ in range(3)])
  closing = threading.Timer(0.3, lambda: [s.close() for s in servers[1:]])
  started = time.monotonic()
  closing.start()
  try:
    leaving.together(tfconfig.ClusterSpec(
        {"worker": list(addresses)}, "worker", 0))
  finally:
    closing.join()
    servers[0].close()  # The chief's own: never waited for.
  assert service.calls == _BARRIER
  assert 0.3 <= time.monotonic() - started < 5


def test_the_chief_waits_for_a_task_still_answering_only_so_long(
    service, monkeypatch, capsys):
  monkeypatch.setattr(leaving, "LEAVE_SECONDS", 0.3)
  server, address = _listener()
  with server:
    started = time.monotonic()
    leaving.together(tfconfig.ClusterSpec(
        {"chief": ["127.0.0.1:1"], "worker": [address]}, "chief", 0))
  assert 0.3 <= time.monotonic() - started < 5
  assert service.calls == _BARRIER
  assert capsys.readouterr().err == (
      f"dist_keras: worker:0 ({address}) still answers 0.3 s after the run "
      "finished; the chief leaves without waiting for it\n")


def test_a_task_is_gone_once_nothing_listens_at_its_address():
  server, address = _listener()
  with server:
    assert leaving.listening(address)
  assert not leaving.listening(address)
