"""The local launcher (dist_keras.launch, run as tools/launch_local.py from
the checkout): ports, TF_CONFIG, output relay, stopping, restarts.

The workers are small Python snippets, not TensorFlow, so each launch takes
well under a second (the grace-period test waits its one second).
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

import helpers
from dist_keras.launch import cli, cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "launch_local.py")

# Every worker snippet starts here: `task` is its TF_CONFIG task index, and
# it announces its pid so the test can check it is gone afterwards.
PRELUDE = """\
import json, os, signal, subprocess, sys, time
tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]["index"]
"""
ANNOUNCE = "print('pid', os.getpid(), flush=True)\n"


def _command(body: str) -> list[str]:
  return ["--", sys.executable, "-c", PRELUDE + body]


def _launch(*args, timeout=30):
  return subprocess.run([sys.executable, TOOL, *args], capture_output=True,
                        text=True, timeout=timeout, check=False)


def _pids(lines) -> list[int]:
  """The pids announced in relayed `[wI] pid N` lines."""
  return [int(line.split()[2]) for line in lines if " pid " in line]


def _gone(pid: int, timeout: float = 5.0) -> bool:
  """Whether process `pid` ends (a zombie counts: it runs nothing)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      with open(f"/proc/{pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
          return True
    except FileNotFoundError:
      return True
    time.sleep(0.05)
  return False


def _start_and_read_pids(args, count):
  """Starts the launcher; returns it once `count` pid lines were relayed."""
  proc = subprocess.Popen([sys.executable, TOOL, *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  lines = []
  while len(_pids(lines)) < count:
    line = proc.stdout.readline()
    assert line, f"launcher ended early: {proc.communicate()}"
    lines.append(line)
  return proc, _pids(lines)


# Pure pieces.


@pytest.mark.parametrize("pick", [
    cluster.free_ports, helpers.free_ports], ids=["launcher", "tests"])
def test_free_ports_are_distinct_and_bindable(pick):
  """The tests that start workers by hand pick theirs as the launcher does
  (two probes closed one by one could return the same port); each can be
  bound, all at once, as a worker's server binds it (every interface)."""
  ports = pick(20)
  assert len(set(ports)) == 20
  assert all(1024 <= p < 65536 for p in ports)
  servers = [socket.socket() for _ in ports]
  try:
    for server, port in zip(servers, ports):
      server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      server.bind(("", port))
      server.listen()
  finally:
    for server in servers:
      server.close()


def test_ports_are_picked_below_the_range_the_os_hands_out():
  """Not a port the OS may give the next outgoing connection (or bind(0))
  before the worker binds it."""
  low = cluster.ephemeral_low()
  assert low > cluster.PICK_FROM + 1000  # (Linux's default: 32768.)
  assert all(cluster.PICK_FROM <= p < low for p in cluster.free_ports(50))


def test_seeding_pythons_random_does_not_repeat_the_picks():
  random.seed(0)
  first = cluster.free_ports(4)
  random.seed(0)
  assert cluster.free_ports(4) != first


def test_a_taken_port_is_passed_over_and_the_os_picks_when_there_is_no_room(
    monkeypatch):
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = taken.getsockname()[1]
    picks = iter([held, cluster.PICK_FROM + 7])
    monkeypatch.setattr(cluster._RANDOM, "sample",  # pylint: disable=protected-access
                        lambda population, k: list(picks))
    assert cluster.free_ports(1) == [cluster.PICK_FROM + 7]
  monkeypatch.undo()
  low = cluster.ephemeral_low()
  monkeypatch.setattr(cluster, "ephemeral_low", lambda: cluster.PICK_FROM)
  ports = cluster.free_ports(3)  # The OS's, from its range.
  assert len(set(ports)) == 3 and all(p >= low for p in ports)


def test_tf_config_names_the_cluster_and_the_task():
  hosts = ["127.0.0.1:1000", "127.0.0.1:1001"]
  assert cluster.make_tf_config(hosts, 1) == {
      "cluster": {"worker": hosts}, "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("returncode,status", [(0, 0), (3, 3), (-9, 137),
                                               (-15, 143)])
def test_exit_status_maps_signals_to_128_plus(returncode, status):
  assert cluster.exit_status(returncode) == status


def test_only_signal_codes_and_listed_codes_are_retryable():
  assert cli.is_retryable(137) and cli.is_retryable(128)
  assert not any(cli.is_retryable(c) for c in (0, 1, 2, 3, 127))
  assert cli.is_retryable(3, frozenset({3}))


def test_parse_args_splits_options_from_the_command():
  args = cli.parse_args(
      ["--num_workers=2", "--max_restarts=1", "--retryable_codes=3,75", "--",
       "python", "-m", "dist_keras.train", "--workdir=/tmp/run"])
  assert args.command == ["python", "-m", "dist_keras.train",
                          "--workdir=/tmp/run"]
  assert args.num_workers == 2 and args.host == "127.0.0.1"
  assert args.codes == {3, 75} and args.hosts is None


# Whole launches.


def test_workers_get_one_cluster_and_their_own_index():
  result = _launch("--num_workers=3", *_command(
      "print(task, json.dumps(tf_config['cluster']['worker']))\n"
      "print('to stderr', file=sys.stderr)"))
  assert result.returncode == 0, result.stderr
  lines = sorted(result.stdout.splitlines())
  assert [line[:5] for line in lines] == ["[w0] ", "[w1] ", "[w2] "]
  clusters = {line.split(" ", 2)[2] for line in lines}
  assert len(clusters) == 1  # Every worker sees the same cluster.
  workers = json.loads(clusters.pop())
  assert [line.split()[1] for line in lines] == ["0", "1", "2"]
  assert all(w.startswith("127.0.0.1:") for w in workers)
  assert len({w.split(":")[1] for w in workers}) == 3
  # stderr goes to stderr, prefixed too.
  assert sorted(result.stderr.splitlines()) == [
      "[w0] to stderr", "[w1] to stderr", "[w2] to stderr"]


def test_a_failed_worker_stops_the_others_and_sets_the_exit_code(tmp_path):
  # Worker 1 fails once worker 0 has announced itself and gone to sleep.
  ready = str(tmp_path / "ready")
  start = time.monotonic()
  result = _launch("--num_workers=2", *_command(
      ANNOUNCE + f"ready = {ready!r}\n"
      "if task == 0:\n"
      "  open(ready, 'w').close()\n"
      "  time.sleep(60)\n"
      "while not os.path.exists(ready):\n"
      "  time.sleep(0.01)\n"
      "sys.exit(3)"))
  assert time.monotonic() - start < 10
  assert result.returncode == 3
  assert result.stderr.splitlines() == [
      "launch_local: worker 1 exited with code 3; stopping the others"]
  pids = {line[:4]: int(line.split()[2])
          for line in result.stdout.splitlines()}
  assert _gone(pids["[w0]"]) and _gone(pids["[w1]"])


def test_group_running_sees_live_groups_only():
  assert cluster.group_running(os.getpgrp())
  ended = subprocess.Popen(["true"], start_new_session=True)
  ended.wait()
  assert not cluster.group_running(ended.pid)


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130),
                                           (signal.SIGTERM, 143)])
def test_a_signal_stops_workers_and_their_subprocesses(signum, status):
  # Each worker has a subprocess of its own: it must not outlive the run.
  launcher, pids = _start_and_read_pids(["--num_workers=2", *_command(
      "child = subprocess.Popen([sys.executable, '-c', "
      "'import time; time.sleep(60)'])\n"
      "print('pid', child.pid, flush=True)\n" + ANNOUNCE + "time.sleep(60)")],
                                        count=4)
  launcher.send_signal(signum)
  _, stderr = launcher.communicate(timeout=15)
  assert launcher.returncode == status, stderr
  assert all(_gone(pid) for pid in pids)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_an_ignored_hangup_or_ctrl_c_stays_ignored(signum):
  """A launcher started under nohup (SIGHUP ignored) or in the background
  (`cmd &`: SIGINT ignored) is not the terminal's to stop, as a run under
  it is not: it stopped the whole cluster when the ssh session closed."""
  launcher = subprocess.Popen(
      [sys.executable, TOOL, "--num_workers=1", *_command(
          ANNOUNCE + "time.sleep(1.5)\nprint('done', flush=True)")],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=lambda: signal.signal(signum, signal.SIG_IGN))
  assert " pid " in launcher.stdout.readline()
  launcher.send_signal(signum)
  stdout, stderr = launcher.communicate(timeout=15)
  assert launcher.returncode == 0, stderr
  assert "done" in stdout


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period():
  launcher, (pid,) = _start_and_read_pids(["--num_workers=1",
                                           "--grace_seconds=1", *_command(
      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + ANNOUNCE +
      "time.sleep(60)")], count=1)
  start = time.monotonic()
  launcher.send_signal(signal.SIGINT)
  launcher.communicate(timeout=15)
  assert launcher.returncode == 130
  assert 0.9 < time.monotonic() - start < 8
  assert _gone(pid)


def test_a_retryable_failure_restarts_the_cluster(tmp_path):
  # Worker 0 is SIGKILLed (137) on the first attempt only.
  marker = tmp_path / "failed_once"
  result = _launch("--num_workers=2", "--max_restarts=2", *_command(
      f"marker = {str(marker)!r}\n"
      "if task == 0 and not os.path.exists(marker):\n"
      "  open(marker, 'w').close()\n"
      "  os.kill(os.getpid(), signal.SIGKILL)\n"
      "print('done')"))
  assert result.returncode == 0, result.stderr
  restarts = [line for line in result.stderr.splitlines()
              if "restart" in line]
  assert restarts == [
      "launch_local: restart 1/2 after worker 0 exited with code 137"]
  # The second attempt ran to the end.
  assert "[w0] done" in result.stdout and "[w1] done" in result.stdout


@pytest.mark.parametrize("code,extra,attempts", [
    (1, [], 1),                         # A bug: rerunning would not help.
    (2, ["--retryable_codes=3"], 1),
    (3, ["--retryable_codes=3"], 3),    # Listed: all 2 restarts used.
    (137, [], 3),
])
def test_which_codes_restart(tmp_path, code, extra, attempts):
  log = tmp_path / "attempts"
  result = _launch("--num_workers=1", "--max_restarts=2", *extra, *_command(
      f"open({str(log)!r}, 'a').write('x')\nsys.exit({code})"))
  assert result.returncode == code
  assert len(log.read_text()) == attempts
  assert result.stderr.count("launch_local: restart") == attempts - 1


def test_hand_made_cluster_runs_one_task_and_passes_its_code_through():
  hosts = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2223"]
  result = _launch(f"--worker_hosts={','.join(hosts)}", "--task_index=2",
                   *_command("print(json.dumps(tf_config)); sys.exit(5)"))
  assert result.returncode == 5
  prefix, tf_config = result.stdout.strip().split(" ", 1)
  assert prefix == "[w2]"
  assert json.loads(tf_config) == {"cluster": {"worker": hosts},
                                   "task": {"type": "worker", "index": 2}}
  assert result.stderr.strip() == "launch_local: worker 2 exited with code 5"


@pytest.mark.parametrize("argv,match", [
    (["--num_workers=2"], "give the worker command after --"),
    (["--num_workers=2", "--"], "give the worker command after --"),
    (["--", "true"], "one of the arguments --num_workers --worker_hosts"),
    (["--num_workers=0", "--", "true"], "--num_workers=0 must be >= 1"),
    (["--num_workers=2", "--worker_hosts=a:1", "--", "true"],
     "not allowed with"),
    (["--worker_hosts=a:1,b:2", "--", "true"], "needs --task_index"),
    (["--worker_hosts=a:1,b:2", "--task_index=2", "--", "true"],
     "--task_index=2 must be in 0..1"),
    (["--worker_hosts=a:1,b", "--task_index=0", "--", "true"], "'b'"),
    (["--worker_hosts=a:1,a:1", "--task_index=0", "--", "true"], "twice"),
    (["--num_workers=2", "--task_index=0", "--", "true"],
     "--task_index goes with --worker_hosts"),
    (["--num_workers=2", "--retryable_codes=x", "--", "true"],
     "--retryable_codes='x'"),
    (["--num_workers=2", "--max_restarts=-1", "--", "true"], "must be >= 0"),
])
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, match):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("dist-keras-launch: error: ") and match in err
  assert err.count("\n") == 1


def test_bad_arguments_exit_2_from_the_command_line():
  result = _launch("--num_workers=-1", "--", "true")
  assert result.returncode == 2
  assert result.stderr == ("launch_local: error: --num_workers=-1 must be "
                           ">= 1.\n")



# The launcher as the package ships it (no tools/ in a wheel).


def test_python_m_dist_keras_launch_runs_outside_the_checkout(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "dist_keras.launch", "--num_workers=2", "--",
       sys.executable, "-c", helpers.TWO_WORKERS], cwd=tmp_path,
      capture_output=True, text=True, timeout=30, check=False,
      env=dict(os.environ, PYTHONPATH=REPO))
  helpers.check_two_workers(result)


def test_a_bare_python_in_the_command_is_the_launchers(tmp_path):
  """A quick-start user runs `.venv/bin/python -m dist_keras.launch -- python
  -m dist_keras.train` with no venv activated: the workers' `python` was
  PATH's (another interpreter, without dist_keras: every worker exited 1).
  Here PATH's `python` is a script that exits 9."""
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "python").write_text("#!/bin/sh\nexit 9\n")
  (fake / "python").chmod(0o755)
  result = subprocess.run(
      [sys.executable, "-m", "dist_keras.launch", "--num_workers=1", "--",
       "python", "-c", "import sys; print(sys.executable)"], cwd=tmp_path,
      capture_output=True, text=True, timeout=30, check=False,
      env=dict(os.environ, PYTHONPATH=REPO,
               PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ["[w0]", sys.executable]


def test_worker_path_puts_the_launchers_python_first():
  assert cluster.worker_path("/usr/bin:/bin", "/v/bin/python") == (
      "/v/bin:/usr/bin:/bin")
  assert cluster.worker_path("/v/bin:/bin", "/v/bin/python") == "/v/bin:/bin"
  assert cluster.worker_path("/bin", "") == "/bin"  # No interpreter path.


def test_the_launcher_imports_no_tensorflow(tmp_path):
  result = subprocess.run(
      [sys.executable, "-c", "import sys; from dist_keras.launch import cli; "
       "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"],
      cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
      env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 0, result.stderr


def test_a_stdout_gone_costs_the_relayed_lines_only():
  """A `| head` that has gone: relaying fails (EPIPE), the launcher's
  stdout goes to /dev/null, the workers' pipes are still drained (none
  blocks on a full one) and their code stands, with no error."""
  reader, writer = os.pipe()
  os.close(reader)
  try:
    result = subprocess.run(
        [sys.executable, "-m", "dist_keras.launch", "--num_workers=2",
         *_command("for i in range(20000):\n  print(task, i)\n"
                   "sys.exit(5 if task == 1 else 0)")],
        stdout=writer, stderr=subprocess.PIPE, text=True, timeout=30,
        check=False, env=dict(os.environ, PYTHONPATH=REPO))
  finally:
    os.close(writer)
  assert result.returncode == 5
  assert result.stderr.splitlines() == [
      "dist-keras-launch: worker 1 exited with code 5; stopping the others"]
