"""The local launcher (dist_keras.launch): a port another process takes
between the launcher's pick and its worker's bind.

The launcher runs in this process with its port picker replaced, so the
first pick is a port the test holds, as a process that took it in between
would; the workers are small Python snippets that check their port as
dist_keras does (strategies.check_port_free), so a launch takes well under
a second. That dist_keras' real refusal is the line the launcher knows is
checked against dist_keras itself."""
import json
import socket
import sys

import pytest

from dist_keras.distribute import strategies, tfconfig
from dist_keras.launch import cli, cluster
from dist_keras.errors import UserError

# The task's port checked as dist_keras checks it; refused in its words.
CHECK_PORT = """\
import json, os, socket, sys
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
address = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][task]
port = int(address.rpartition(":")[2])
probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
  probe.bind(("", port))
except OSError:
  print(f"dist_keras: error: TF_CONFIG gives this task (worker:{task}) "
        f"{address}, but port {port} is in use on this machine (by another "
        "process, or a worker of an earlier run still running); free it, or "
        "give the task another port.", file=sys.stderr)
  sys.exit(CODE)
print("bound", port, flush=True)
"""


@pytest.fixture
def held():
  """A port another process holds (listening, as a server would)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]


def _picks(monkeypatch, *first):
  """The launcher's picks: `first` for as many attempts as given (each a
  list of ports), then free ones."""
  queue = list(first)
  monkeypatch.setattr(cli, "free_ports", lambda n, host: (
      queue.pop(0) if queue else cluster.free_ports(n, host)))


def _launch(capfd, *options, code=2):
  status = cli.main(
      [*options, "--", sys.executable, "-c",
       CHECK_PORT.replace("CODE", str(code))])
  out, err = capfd.readouterr()
  return status, out.splitlines(), [
      line for line in err.splitlines() if line.startswith(f"{cli.PROG}:")]


def _retry_line(port, attempt):
  return (f"{cli.PROG}: port {port} of worker 0 was taken by another "
          "process after the launcher picked it; restarting every worker on "
          f"fresh ports ({attempt}/{cli.PORT_RETRIES})")


def test_a_port_taken_before_its_worker_binds_it_is_picked_afresh(
    capfd, monkeypatch, held):
  """The launch failed: `worker 0 exited with code 2`, exit 2."""
  _picks(monkeypatch, [held, cluster.free_ports(1)[0]])
  status, out, said = _launch(capfd, "--num_workers=2")
  assert status == 0, said
  assert said == [_retry_line(held, 1)]
  bound = [int(line.split()[2]) for line in out if line.startswith("[w0]")]
  assert len(bound) == 1 and bound != [held]


def test_port_retries_are_bounded(capfd, monkeypatch, held):
  _picks(monkeypatch, *[[held]] * 10)
  status, _, said = _launch(capfd, "--num_workers=1", "--max_restarts=5")
  assert status == 2
  assert said == [_retry_line(held, i) for i in (1, 2, 3)] + [
      f"{cli.PROG}: worker 0 exited with code 2"]


@pytest.mark.parametrize("options,code", [
    (["--num_workers=1"], 1),  # Not dist_keras' refusal: another error.
    (["--worker_hosts=127.0.0.1:{held}", "--task_index=0"], 2),  # Yours.
])
def test_other_failures_are_not_taken_for_a_port_race(
    capfd, monkeypatch, held, options, code):
  _picks(monkeypatch, [held])
  status, _, said = _launch(
      capfd, *[o.format(held=held) for o in options], code=code)
  assert status == code
  assert said == [f"{cli.PROG}: worker 0 exited with code {code}"]


def test_a_refusal_naming_another_port_is_not_a_port_race(capfd, held):
  status = cli.main(["--num_workers=1", "--", sys.executable, "-c",
                     CHECK_PORT.replace("CODE", "2").replace(
                         "port = int(", f"port = {held} or int(")])
  assert status == 2
  assert "restarting" not in capfd.readouterr().err


def test_the_launcher_knows_dist_keras_refusal(held):
  spec = tfconfig.parse(json.dumps({
      "cluster": {"worker": [f"127.0.0.1:{held}", "127.0.0.1:1"]},
      "task": {"type": "worker", "index": 0}}))
  with pytest.raises(UserError) as refusal:
    strategies.check_port_free(spec)
  line = f"dist_keras: error: {refusal.value}".encode()  # As train.py says.
  assert cluster.PORT_IN_USE.search(line).group(1) == str(held).encode()
