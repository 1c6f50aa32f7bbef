"""TensorFlow's collective runtime start, watched (distribute/start_watch.py):
a worker whose peer was seen by the rendezvous but never started its
runtime (it ended, or something else listened at its address) waited
inside TensorFlow's start forever, silent (its leader has no deadline, and
the call holds the interpreter). Now a watch process says why and kills it
(exit 137, retryable), having written nothing."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import helpers
from dist_keras.distribute import start_watch

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO,
           PYTHONUNBUFFERED="1")
WAITING = {"worker:1": "h1:2222", "worker:2": "h2:2222"}


def test_a_start_goes_on_while_no_peer_refused_long_and_time_is_left():
  assert start_watch.verdict("worker:0", WAITING, {}, 599.0, 600) is None
  assert start_watch.verdict(
      "worker:0", WAITING, {"worker:1": start_watch.LOST_SECONDS - 0.1},
      10.0, 600) is None
  assert start_watch.verdict("worker:0", WAITING, {}, 1e6, 0) is None


def test_a_peer_refusing_for_its_time_is_named_lost_with_its_address():
  line = start_watch.verdict(
      "worker:0", WAITING, {"worker:2": start_watch.LOST_SECONDS}, 11.0, 0)
  assert line.startswith(
      "worker:0 lost worker:2 at h2:2222 as TensorFlow's collective runtime "
      "started: it stopped listening after it was seen")
  assert "exit 137" in line and "nothing was written" in line


def test_a_start_past_its_time_names_every_peer_and_the_setting():
  line = start_watch.verdict("worker:0", WAITING, {}, 600.2, 600)
  assert line.startswith(
      "worker:0: TensorFlow's collective runtime did not start within 600 s "
      "after every other task's port answered (worker:1 at h1:2222, "
      "worker:2 at h2:2222)")
  assert line.endswith("or raise runtime.peer_start_timeout_seconds "
                       "(0: no limit).")


def _watch_in_thread(monkeypatch, pid, probe, timeout_seconds=0.0, every=60):
  """start_watch._watch on a pipe for stdin; returns its write end."""
  read, write = os.pipe()
  monkeypatch.setattr(sys, "stdin", os.fdopen(read))
  thread = threading.Thread(target=start_watch._watch, args=(  # pylint: disable=protected-access
      pid, "worker:0", {"worker:1": "h1:1"}, timeout_seconds, probe, every))
  thread.start()
  return thread, write


def test_the_watch_kills_the_process_once_a_peer_stops_listening(
    monkeypatch, capsys):
  monkeypatch.setattr(start_watch, "LOST_SECONDS", 0.6)
  monkeypatch.setattr(start_watch, "PROBE_SECONDS", 0.05)
  answers = iter([True, None, False, True] + [False] * 1000)
  victim = subprocess.Popen(["sleep", "60"])
  start = time.monotonic()
  thread, write = _watch_in_thread(monkeypatch, victim.pid,
                                   lambda address: next(answers), every=0.3)
  thread.join(10)
  os.close(write)
  assert victim.wait(5) == -signal.SIGKILL
  assert 0.6 < time.monotonic() - start < 5
  out, err = capsys.readouterr()
  assert err.startswith("dist_keras: error: worker:0 lost worker:1 at h1:1 ")
  # A peer that answered again (True) or could not be told (None) was
  # not counted as lost; the wait was said while it went on.
  assert "dist_keras: worker:0 still waits for TensorFlow's collective " \
         "runtime to start on every task (" in out


def test_the_watch_ends_without_a_word_when_the_start_is_over(
    monkeypatch, capsys):
  victim = subprocess.Popen(["sleep", "60"])
  thread, write = _watch_in_thread(monkeypatch, victim.pid,
                                   lambda address: False, every=60)
  os.close(write)  # Started.
  thread.join(10)
  assert not thread.is_alive() and victim.poll() is None
  victim.kill()
  assert capsys.readouterr() == ("", "")


def test_a_watched_block_that_returns_ends_its_watch_process(capfd):
  with start_watch.watched("worker:0", {"worker:1": "127.0.0.1:1"}, 0):
    (watch,) = _children("dist_keras.distribute.start_watch")
    time.sleep(0.5)  # (Its handlers set.)
    # Ctrl-C at a terminal reaches the watch too: the run's, not its own.
    os.kill(int(watch.split()[0]), signal.SIGINT)
    time.sleep(0.3)
    assert _children("dist_keras.distribute.start_watch")
  assert not _children("dist_keras.distribute.start_watch")
  assert capfd.readouterr() == ("", "")


def _children(name: str) -> list[str]:
  out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())],
                       capture_output=True, text=True, check=False).stdout
  return [line for line in out.splitlines() if name in line]


@pytest.mark.parametrize("peer", ["ended", "stranger"])
def test_a_peer_seen_that_never_starts_its_runtime_ends_the_worker(
    tmp_path, peer):
  """Worker 0 of 2 alone; a plain socket at worker 1's address answers the
  rendezvous (what a peer's placeholder does), then closes ("ended": its
  process died before its runtime started) or stays (another process
  listening there). Before, worker 0 waited in TensorFlow's start, silent."""
  ports = helpers.free_ports(2)
  hosts = [f"127.0.0.1:{p}" for p in ports]
  seen = socket.create_server(("", ports[1]))
  tf_config = json.dumps({"cluster": {"worker": hosts},
                          "task": {"type": "worker", "index": 0}})
  worker = subprocess.Popen(
      [sys.executable, "-m", "dist_keras.train",
       f"--workdir={tmp_path / 'run'}", "--config.train.steps=2",
       "--config.model.units=8", "--config.log.peak_tflops=1.0",
       # A stranger stays: the deadline ends the start; an ended peer is
       # found first (start_watch.LOST_SECONDS).
       "--config.runtime.peer_start_timeout_seconds="
       f"{4 if peer == 'stranger' else 120}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      cwd=helpers.REPO, env=dict(ENV, TF_CONFIG=tf_config))
  try:
    for line in worker.stdout:
      if "starting TensorFlow's collective runtime" in line and (
          peer == "ended"):
        seen.close()
    _, stderr = worker.communicate(timeout=60)
  finally:
    worker.kill()
    seen.close()
  assert worker.returncode == -signal.SIGKILL, stderr[-2000:]
  ours = [line for line in stderr.splitlines()
          if line.startswith("dist_keras: error: ")]
  assert len(ours) == 1, stderr[-2000:]
  if peer == "ended":
    assert ours[0].startswith(
        f"dist_keras: error: worker:0 lost worker:1 at {hosts[1]} as "
        "TensorFlow's collective runtime started")
  else:
    assert ours[0].startswith(
        "dist_keras: error: worker:0: TensorFlow's collective runtime did "
        f"not start within 4 s after every other task's port answered "
        f"(worker:1 at {hosts[1]})")
  assert not (tmp_path / "run").exists()  # Nothing was written.
