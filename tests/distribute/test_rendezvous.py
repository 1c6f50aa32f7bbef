"""A multi-worker run's start (distribute/rendezvous.py): a worker says whom
it waits for and where, says it again while it waits, gives up after
runtime.peer_start_timeout_seconds naming the peer that never came (exit
200, nothing written), and SIGTERM or Ctrl-C while it waits stops it at
once (143, 130). Before, a worker whose peer never came waited inside
TensorFlow's start with no deadline, deaf to SIGTERM, until a SIGKILL."""
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
from dist_keras import errors
from dist_keras.distribute import rendezvous, tfconfig

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.REPO,
           PYTHONUNBUFFERED="1")


def _cluster(index: int, hosts: list[str]) -> tfconfig.ClusterSpec:
  return tfconfig.ClusterSpec({"worker": hosts}, "worker", index)


def _hosts(n: int = 2) -> list[str]:
  return [f"127.0.0.1:{port}" for port in helpers.free_ports(n)]


def test_a_lone_worker_gives_up_naming_the_peer_its_address_and_the_fix(
    capsys):
  hosts = _hosts(3)
  start = time.monotonic()
  with pytest.raises(errors.PeersNeverStarted) as raised:
    rendezvous.wait_for_peers(_cluster(1, hosts), timeout_seconds=1.0)
  assert time.monotonic() - start < 3
  assert raised.value.exit_code == errors.EXIT_PEER_LOST >= 128
  assert str(raised.value) == (
      f"worker:1 waited 1 s for worker:0 at {hosts[0]}, worker:2 at "
      f"{hosts[2]}, which never started listening: start them, or fix their "
      "addresses in TF_CONFIG (on Kubernetes, `kubectl describe pod` of a "
      "pod not Running says why), or raise "
      "runtime.peer_start_timeout_seconds (0: no limit); nothing was "
      "written.")
  assert capsys.readouterr().out == (
      f"dist_keras: worker:1 waits for the other tasks to start (worker:0 "
      f"at {hosts[0]}, worker:2 at {hosts[2]}; up to 1 s: "
      "runtime.peer_start_timeout_seconds)\n")


def test_it_says_who_it_still_waits_for_and_stops_waiting_for_who_came(
    capsys):
  hosts = _hosts(3)
  came = rendezvous._placeholder(hosts[2])  # pylint: disable=protected-access
  with came, pytest.raises(errors.PeersNeverStarted, match=(
      rf"waited 1 s for worker:1 at {hosts[1]}, which never started "
      "listening: start it, or fix its address in TF_CONFIG")):
    rendezvous.wait_for_peers(_cluster(0, hosts), 1.2, every=0.5)
  lines = capsys.readouterr().out.splitlines()
  assert lines[1:] and all(
      line.startswith(f"dist_keras: worker:0 still waits for worker:1 at "
                      f"{hosts[1]} (") for line in lines[1:]), lines


def test_workers_that_wait_for_each_other_all_go_on(capsys):
  """Each holds its port while it waits, so each sees the others, started
  in any order; none waits for itself, and a one-task cluster not at all."""
  hosts = _hosts(3)
  done, all_done = [], threading.Event()

  def worker(i):
    rendezvous.wait_for_peers(_cluster(i, hosts), timeout_seconds=20)
    # TensorFlow's server takes the port then: the others still see it.
    with socket.create_server(("", int(hosts[i].rpartition(":")[2]))):
      done.append(i)
      all_done.wait(timeout=30)

  threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
  for thread in threads:
    thread.start()
    time.sleep(0.5)
  deadline = time.monotonic() + 25
  while len(done) < 3 and time.monotonic() < deadline:
    time.sleep(0.1)
  all_done.set()
  for thread in threads:
    thread.join(timeout=30)
  assert sorted(done) == [0, 1, 2]
  assert capsys.readouterr().out.count("saw every other task start") == 3
  rendezvous.wait_for_peers(_cluster(0, hosts[:1]), timeout_seconds=1)
  assert capsys.readouterr().out == ""


@pytest.mark.parametrize("signum, kind, name, code", [
    (signal.SIGTERM, errors.Preempted, "SIGTERM", 143),
    (signal.SIGINT, errors.Interrupted, r"Ctrl-C \(SIGINT\)", 130)])
def test_a_stop_request_while_waiting_stops_it_at_once(signum, kind, name,
                                                       code):
  hosts = _hosts()
  before = signal.getsignal(signum)
  threading.Timer(0.5, os.kill, (os.getpid(), signum)).start()
  start = time.monotonic()
  with pytest.raises(kind, match=(
      rf"^stopped by {name} before training began, while worker:0 waited "
      rf"for worker:1 at {hosts[1]} to start; nothing was written; rerun "
      "the same command on every worker.$")) as raised:
    rendezvous.wait_for_peers(_cluster(0, hosts), timeout_seconds=0)
  assert time.monotonic() - start < 2
  assert raised.value.exit_code == code
  assert signal.getsignal(signum) is before  # Its handler put back.


def _lone_worker(workdir, *args) -> subprocess.Popen:
  """Worker 0 of a two-worker TF_CONFIG whose worker 1 is never started."""
  tf_config = json.dumps({"cluster": {"worker": _hosts()},
                          "task": {"type": "worker", "index": 0}})
  return subprocess.Popen(
      [sys.executable, "-m", "dist_keras.train", f"--workdir={workdir}",
       "--config.train.steps=2", *args], cwd=helpers.REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(ENV, TF_CONFIG=tf_config))


def _ours(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines()
          if line.startswith("dist_keras: error: ")]


@pytest.mark.slow  # ~20 s, mostly TensorFlow's import; the line: above.
def test_a_lone_worker_of_the_command_line_exits_200_within_its_timeout(
    tmp_path):
  proc = _lone_worker(tmp_path / "run",
                      "--config.runtime.peer_start_timeout_seconds=3")
  try:
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == errors.EXIT_PEER_LOST, err[-2000:]
  assert "dist_keras: worker:0 waits for the other tasks to start" in out
  [line] = _ours(err)
  assert line.startswith("dist_keras: error: worker:0 waited 3 s for "
                         "worker:1 at 127.0.0.1:"), line
  assert not (tmp_path / "run").exists()


def test_sigterm_to_a_worker_waiting_for_its_peer_stops_it_at_once(tmp_path):
  """It stayed until SIGKILL (TensorFlow's SIGTERM handler, set inside the
  call that waits, records the signal only)."""
  proc = _lone_worker(tmp_path / "run")
  try:
    for line in proc.stdout:
      if "worker:1 at" in line:  # It waits.
        break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
  finally:
    proc.kill()
  assert proc.returncode == errors.EXIT_PREEMPTED, err[-2000:]
  [line] = _ours(err)
  assert line.startswith("dist_keras: error: stopped by SIGTERM before "
                         "training began, while worker:0 waited for "
                         "worker:1 at 127.0.0.1:"), line
  assert not (tmp_path / "run").exists()
