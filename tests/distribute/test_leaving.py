"""distribute/leaving.py: a finished cluster's workers meet at a barrier,
then the others exit and the chief waits until their processes have ended
(on a real cluster: tests/distribute/test_multi_worker.py); at exit, for
dist_keras.fit (tests/distribute/test_fit_leaves_together.py) and the
tests' worker scripts; workers that stop early (a refusal, a divergence, a
stop request) meet before they leave (a SIGTERM's end to end:
test_multi_worker.py's test_sigterm_to_one_worker_...)."""
import errno
import json
import signal
import socket
import threading
import time
import types

import pytest
import tensorflow as tf

from dist_keras.distribute import leaving, peers, reports, tfconfig


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
  monkeypatch.setattr(peers, "listening", pytest.fail)
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
    assert peers.listening(address) is True
  assert peers.listening(address) is False


@pytest.mark.parametrize("error,answer", [
    (OSError(errno.EHOSTUNREACH, "No route to host"), False),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), False),
    (socket.timeout("timed out"), None)])
def test_an_unreachable_task_is_gone_and_a_silent_one_not_said_to_answer(
    service, monkeypatch, capsys, error, answer):
  """A worker's host gone after it left (a pod deleted) counted as still
  listening: the chief waited the whole LEAVE_SECONDS, then said the task
  "still answers"."""
  def connect(*args, **kwargs):
    raise error
  monkeypatch.setattr(peers.socket, "create_connection", connect)
  monkeypatch.setattr(leaving, "LEAVE_SECONDS", 0.3)
  assert peers.listening("w1:2222") is answer
  started = time.monotonic()
  leaving.together(tfconfig.ClusterSpec(
      {"chief": ["c:1"], "worker": ["w1:2222"]}, "chief", 0))
  waited, said = time.monotonic() - started, capsys.readouterr().err
  if answer is False:
    assert waited < 0.3 and said == ""
  else:
    assert said == ("dist_keras: worker:0 (w1:2222) could not be reached "
                    "0.3 s after the run finished; the chief leaves without "
                    "waiting for it\n")


# --- As the interpreter exits (dist_keras.fit's runs) -----------------------

_WORKER_1 = tfconfig.ClusterSpec({"worker": ["a:1", "b:1"]}, "worker", 1)


@pytest.fixture(name="armed")
def _armed(monkeypatch):
  """leaving.at_exit armed with _WORKER_1's cluster, atexit's registry
  left alone."""
  monkeypatch.setattr(leaving.atexit, "register", lambda handler: None)
  monkeypatch.setattr(leaving, "_AT_EXIT", leaving._AtExit())  # pylint: disable=protected-access
  monkeypatch.delattr(leaving.sys, "last_value", raising=False)
  leaving.at_exit(_WORKER_1)


def test_a_finished_run_leaves_together_at_exit(armed, service, capsys):
  del armed
  leaving.leave_at_exit()
  assert service.calls == _BARRIER
  assert capsys.readouterr() == ("", "")


def test_a_disarmed_process_leaves_alone(armed, service):
  del armed
  leaving.at_exit(None)
  leaving.leave_at_exit()
  assert not service.calls


@pytest.mark.parametrize("error", [ValueError("bug"), KeyboardInterrupt()])
def test_a_script_ending_in_an_error_or_ctrl_c_leaves_at_once(
    armed, service, monkeypatch, error):
  """The barrier holds the interpreter: a Ctrl-C could not end the wait
  for a peer whose script goes on."""
  del armed
  monkeypatch.setattr(leaving.sys, "last_value", error, raising=False)
  leaving.leave_at_exit()
  assert not service.calls


def test_an_error_from_before_the_run_does_not_count(service, monkeypatch):
  """sys.last_value stays from an error a REPL (or pytest) showed."""
  monkeypatch.setattr(leaving.atexit, "register", lambda handler: None)
  monkeypatch.setattr(leaving, "_AT_EXIT", leaving._AtExit())  # pylint: disable=protected-access
  monkeypatch.setattr(leaving.sys, "last_value", ValueError("earlier"),
                      raising=False)
  leaving.at_exit(_WORKER_1)
  leaving.leave_at_exit()
  assert service.calls == _BARRIER


def test_a_peer_lost_at_exit_is_one_line(armed, monkeypatch, capsys):
  """No traceback, no hang; the exit code stays the script's."""
  del armed

  def lost(barrier, timeout_ms):
    raise tf.errors.UnavailableError(
        None, None, "Task /job:worker/replica:0/task:0 heartbeat timeout\n"
        "more lines")

  monkeypatch.setattr(leaving.context, "context", lambda: types.SimpleNamespace(
      wait_at_barrier=lost))
  leaving.leave_at_exit()
  assert capsys.readouterr() == ("", (
      "dist_keras: task worker:0 did not leave together with this worker at "
      "exit (UnavailableError: Task /job:worker/replica:0/task:0 heartbeat "
      "timeout); this worker's run had finished: it leaves alone.\n"))


def test_ctrl_c_while_leaving_at_exit_says_nothing(armed, monkeypatch, capsys):
  """Python raises it once the barrier returns: the process is leaving."""
  del armed

  def interrupted(barrier, timeout_ms):
    raise KeyboardInterrupt

  monkeypatch.setattr(leaving.context, "context", lambda: types.SimpleNamespace(
      wait_at_barrier=interrupted))
  leaving.leave_at_exit()
  assert capsys.readouterr() == ("", "")


def test_workers_refusing_different_configs_meet_before_they_leave(
    service, monkeypatch):
  """Each worker sees the digest sum differ and refuses; one that left at
  once closed its channel while its peer still received the sum's last
  ring step (the peer said 'lost contact', exit 200, not the refusal)."""
  from dist_keras.training import allreduce  # pylint: disable=g-import-not-at-top

  class Cluster(tf.distribute.MultiWorkerMirroredStrategy):
    num_replicas_in_sync = 2

    def __init__(self):  # pylint: disable=super-init-not-called
      pass

  monkeypatch.setattr(allreduce, "host_value_sum",
                      lambda strategy: lambda value: value + 1.0)
  config = {"data": {"name": "synthetic", "data_dir": "/here"}}
  with pytest.raises(allreduce.UserError, match="different configs") as e:
    allreduce.check_same_config(Cluster(), config)
  assert service.calls == [(leaving.REFUSED, 60_000)]
  assert e.value.every_worker  # Every worker raised it: none reports it.
  service.calls.clear()
  monkeypatch.setattr(allreduce, "host_value_sum",
                      lambda strategy: lambda value: 2 * value)
  allreduce.check_same_config(Cluster(), config)  # The same: no barrier.
  assert not service.calls


def test_workers_disagreeing_on_the_resume_step_meet_before_they_leave(
    service, monkeypatch):
  from dist_keras.training import checkpoints  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(checkpoints.allreduce, "host_value_sum",
                      lambda strategy: lambda step: step + 1)
  strategy = types.SimpleNamespace(num_replicas_in_sync=2)
  with pytest.raises(checkpoints.UserError, match="workers disagree") as e:
    checkpoints.check_workers_agree(strategy, 5, 2, "/w")
  assert service.calls == [(leaving.REFUSED, 60_000)]
  assert e.value.every_worker


@pytest.mark.parametrize("own_step", [False, True])
@pytest.mark.parametrize("multi_worker, retries_left, met", [
    (True, 0, True), (True, 1, False), (False, 0, False)])
def test_workers_stopping_at_divergence_meet_before_they_leave(
    monkeypatch, multi_worker, retries_left, met, own_step):
  """The loss and gradients (a model's own train_step: its logs) are
  all-reduced: every worker stops at the same step; one going back to a
  checkpoint (a retry left) goes on."""
  import keras  # pylint: disable=g-import-not-at-top
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  from dist_keras.training import divergence  # pylint: disable=g-import-not-at-top
  barriers = []
  monkeypatch.setattr(leaving, "met", barriers.append)
  run = types.SimpleNamespace(multi_worker=multi_worker, step=7,
                              retries_left=retries_left, skipped_steps=0,
                              step_logs={"loss": float("nan")})
  out = ({"finite": False} if own_step else
         {"loss": float("nan"), "finite_grads": True, "skipped": 0})
  with pytest.raises(errors.Diverged) as e:
    divergence.check(run, out, keras.optimizers.SGD(),
                     types.SimpleNamespace(saved_at=None))
  assert barriers == ([leaving.REFUSED] if met else [])
  assert e.value.every_worker == met  # Met: reported by none.


def _stop_at(monkeypatch, multi_worker, signum=signal.SIGTERM):
  """AnswerStopRequest at step 10, every worker agreed to stop there (a
  collective under multi-worker training); its checkpoint saved."""
  from dist_keras.training import actions, preemption, settings  # pylint: disable=g-import-not-at-top
  stop = preemption.StopRequest(None, multi_worker, agree_every=5)
  stop.signal = signum
  monkeypatch.setattr(stop, "agreed", lambda: True)
  saved = types.SimpleNamespace(saved_at=10, folder="/w/checkpoints",
                                last_saved=lambda: "/w/checkpoints/ckpt-10")
  run = actions.RunState(settings.Schedule(
      steps=100, log_every=5, checkpoint_every=5, eval_every=0), step=10,
                         multi_worker=multi_worker)
  return actions.AnswerStopRequest(run, stop, saved)


def test_workers_stopping_for_a_sigterm_meet_briefly_before_they_exit(
    service, monkeypatch, capsys):
  """The stop is agreed in an all-reduce: one leaving at once could cut a
  peer's last receive of it (the peer exited 200, a lost worker, not 143).
  The meeting is short: a preempted peer may be gone already."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.Preempted, match=(
      r"stopped by SIGTERM after step 10; checkpoint ckpt-10 saved in "
      r"/w/checkpoints; rerun")):
    _stop_at(monkeypatch, multi_worker=True).at(10, epoch_end=False)
  assert service.calls == [(leaving.STOPPED, leaving.STOP_SECONDS * 1000)]
  assert leaving.STOP_SECONDS <= 10
  assert capsys.readouterr() == ("", "")
  service.calls.clear()
  with pytest.raises(errors.Interrupted):  # A Ctrl-C: the same meeting.
    _stop_at(monkeypatch, True, signal.SIGINT).at(10, epoch_end=False)
  assert service.calls == [(leaving.STOPPED, leaving.STOP_SECONDS * 1000)]


def test_one_process_stopping_for_a_sigterm_meets_no_one(
    service, monkeypatch):
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.Preempted):
    _stop_at(monkeypatch, multi_worker=False).at(10, epoch_end=False)
  assert not service.calls


@pytest.mark.parametrize("error", [
    tf.errors.DeadlineExceededError(None, None, "Barrier timed out. Id: x"),
    tf.errors.UnavailableError(None, None, "Failed to send RPC to "
                               "coordination service\nmore")])
def test_a_peer_missing_the_stop_meeting_leaves_the_exit_143(
    monkeypatch, capsys, error):
  """Gone (killed after its grace period: the service's RPC fails) or
  late: one line, and the stop's own exit."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top

  def missed(barrier, timeout_ms):
    raise error

  monkeypatch.setattr(leaving.context, "context", lambda: types.SimpleNamespace(
      wait_at_barrier=missed))
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                     '"task": {"type": "worker", "index": 1}}')
  with pytest.raises(errors.Preempted) as stopped:
    _stop_at(monkeypatch, multi_worker=True).at(10, epoch_end=False)
  assert stopped.value.code == errors.EXIT_PREEMPTED
  out, err = capsys.readouterr()
  assert out == "" and err == (
      f"dist_keras: a peer task did not meet this worker as it stopped "
      f"({type(error).__name__}: {str(error).splitlines()[0]}); it stops "
      "alone.\n")


@pytest.mark.parametrize("script, args, work", [
    ("eval_ids", ["--out={dir}/ids{{task}}.npy"], "evaluated_ids"),
    ("train_weights", ["--strategy=one_device", "--devices=1",
                       "--out={dir}/w{{task}}.npz"], "models_after_training")])
def test_the_tests_worker_scripts_leave_together_as_fit_does(
    monkeypatch, tmp_path, script, args, work):
  """tests/scripts' workers (run under the launcher) ended right after
  their last collective, each on its own: dist_keras.fit's workers leave
  together at exit."""
  import importlib  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(script)
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                     '"task": {"type": "worker", "index": 1}}')
  monkeypatch.setattr(module.strategies, "get_strategy", lambda runtime: (
      types.SimpleNamespace(num_replicas_in_sync=1)))
  monkeypatch.setattr(module, work, lambda *args, **kwargs: (
      np.arange(3) if script == "eval_ids" else {"w": np.arange(3)}))
  armed = []
  monkeypatch.setattr(leaving, "at_exit", lambda cluster: armed.append(
      (cluster, sorted(p.name for p in tmp_path.iterdir()))))
  monkeypatch.setattr(module.sys, "argv", [script, *[
      arg.format(dir=tmp_path) for arg in args]])
  module.main()
  written = "ids1.npy" if script == "eval_ids" else "w1.npz"
  assert armed == [(tfconfig.from_env(), [written])]  # After its output.


class _Reporting:
  """The coordination service as `report` and `joined` use it: its keys,
  the errors reported, and what a call raises."""

  coordination_service = object()  # (Configured: a cluster's.)

  def __init__(self, probe_error=None, report_error=None):
    self.keys, self.reported = {}, []
    self.probe_error, self.report_error = probe_error, report_error

  def set_config_key_value(self, key, value):
    if key in self.keys:
      raise tf.errors.AlreadyExistsError(None, None, f"key {key} exists.")
    self.keys[key] = value

  def get_config_key_value(self, key, timeout_ms):
    self.keys[("probed", key)] = timeout_ms
    if self.probe_error:
      raise self.probe_error
    if key not in self.keys:
      raise tf.errors.DeadlineExceededError(None, None, f"{key}: timed out")
    return self.keys[key]

  def report_error_to_cluster(self, code, message):
    if self.report_error:
      raise self.report_error
    self.reported.append((code, message))


_WORKER_1 = tfconfig.ClusterSpec({"worker": ["h:1", "h:2"]}, "worker", 1)


def _reporting(monkeypatch, **failures):
  service = _Reporting(**failures)
  monkeypatch.setattr(reports.context, "context", lambda: service)
  monkeypatch.setattr(reports, "_JOINED_HERE", set())
  reports.joined(_WORKER_1)
  reports.joined(_WORKER_1)  # A second fit in this process: no error.
  return service


def test_a_workers_own_refusal_is_reported_to_the_others(monkeypatch):
  """Its peers' collectives then fail with its line (peers.stopped), not
  as if it had died; the service is asked first, in a deadline, whether
  it answers (the report itself waits as long as a hung chief)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  reports.report(errors.UserError("dataset_fn('train', ...) ran out."),
                 _WORKER_1)
  assert service.reported == [(
      tf.errors.FAILED_PRECONDITION,
      "dist_keras: worker:1 stopped the job (exit 2): dataset_fn('train', "
      "...) ran out.")]
  assert service.keys[("probed", "dist_keras/joined/worker:1")] == 2000


def test_an_error_a_users_function_raised_is_reported_as_its_line(
    monkeypatch):
  """As train.py says it, exit 1, without its hint to rerun with
  --verbose (the traceback is this worker's)."""
  from dist_keras import origins  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  with pytest.raises(RuntimeError) as raised:
    with origins.raised_in("dataset_fn('train', ...) my.mod:fn"):
      raise RuntimeError("shard missing")
  reports.report(raised.value, _WORKER_1)
  assert service.reported == [(
      tf.errors.FAILED_PRECONDITION,
      "dist_keras: worker:1 stopped the job (exit 1): RuntimeError: shard "
      "missing (raised in dataset_fn('train', ...) my.mod:fn)")]


def test_what_every_worker_raised_or_no_cluster_has_is_not_reported(
    monkeypatch):
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  together = errors.UserError("different configs")
  together.every_worker = True  # (refused_together's, after meeting.)
  for error, cluster in [
      (together, _WORKER_1),
      (errors.StoppedByPeer("worker:0 stopped the job: bad"), _WORKER_1),
      (errors.PeerLost("lost contact"), _WORKER_1),  # Not a UserError.
      (errors.Preempted("preempted"), _WORKER_1),
      (ValueError("a bug"), _WORKER_1),
      (errors.UserError("one worker"), None),
      (errors.UserError("one worker"), tfconfig.ClusterSpec(
          {"worker": ["h:1"]}, "worker", 0))]:
    reports.report(error, cluster)
  assert not service.reported
  service.coordination_service = None  # (Mirrored under a TF_CONFIG.)
  reports.report(errors.UserError("no service"), _WORKER_1)
  assert not service.reported


@pytest.mark.parametrize("failure", [
    {"probe_error": tf.errors.DeadlineExceededError(None, None, "timed out")},
    {"report_error": tf.errors.UnavailableError(None, None, "chief gone")},
    {"report_error": ValueError("Context is not initialized.")}])
def test_a_report_that_fails_is_ignored(monkeypatch, failure):
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch, **failure)
  reports.report(errors.UserError("bad data"), _WORKER_1)  # No raise.
  assert not service.reported


def test_a_report_keeps_its_text_where_a_peer_past_its_barrier_reads_it(
    monkeypatch):
  """A peer that comes to a barrier after the report fails there with
  TensorFlow's "Agent must be in CONNECTED state" alone: it said 'lost
  contact with a peer task'; the text kept in the service names the
  worker and its line. Other errors read nothing (a lost peer's)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  not_connected = tf.errors.FailedPreconditionError(
      None, None, "Agent must be in CONNECTED state. It is currently in ERROR.")
  assert reports.stopped(not_connected) is None  # Nothing reported yet.
  reports.report(errors.UserError("bad data on worker 1."), _WORKER_1)
  assert service.keys["dist_keras/reported"] == (
      "dist_keras: worker:1 stopped the job (exit 2): bad data on worker 1.")
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["h:1", "h:2"]},
      "task": {"type": "worker", "index": 0}}))
  stopped = reports.stopped(not_connected)
  assert str(stopped) == "worker:1 stopped the job: bad data on worker 1."
  assert stopped.exit_code == errors.EXIT_CONFIG_ERROR
  assert reports.stopped(tf.errors.UnavailableError(
      None, None, "Socket closed")) is None
  # Two refusing at once: the first's line is kept, both are reported.
  reports.report(errors.UserError("bad data too."), _WORKER_1)
  assert len(service.reported) == 2
  assert str(reports.stopped(not_connected)).endswith("on worker 1.")


def test_a_worker_that_never_joined_reports_nothing_and_waits_not(
    monkeypatch):
  """Its key's probe would wait 2 s for a key never put (a refusal before
  the run joined: fit's door now joins first, api.build as the strategy
  starts)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  monkeypatch.setattr(reports, "_JOINED_HERE", set())
  reports.report(errors.UserError("bad data"), _WORKER_1)
  assert not service.reported
  assert ("probed", "dist_keras/joined/worker:1") not in service.keys


# --- A chief that reported waits for the others to have its line ------------

class _Waiting(_Reporting):
  """The service as a chief that reported looks for the others' keys: a
  missing key's read waits its deadline, as TensorFlow's does."""

  def get_config_key_value(self, key, timeout_ms):
    if key not in self.keys:
      time.sleep(timeout_ms / 1000)
    return super().get_config_key_value(key, timeout_ms)


def _chief_reports(monkeypatch, peer_address) -> tuple[float, _Waiting]:
  """(seconds the chief of a 2-worker cluster, worker 1 at `peer_address`,
  took to report its own refusal, the service)."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _Waiting()
  monkeypatch.setattr(reports.context, "context", lambda: service)
  monkeypatch.setattr(reports, "_JOINED_HERE", set())
  chief = tfconfig.ClusterSpec({"worker": ["127.0.0.1:1", peer_address]},
                               "worker", 0)
  reports.joined(chief)
  started = time.monotonic()
  reports.report(errors.UserError("bad data on the chief."), chief)
  assert service.reported  # (Reported before it waits.)
  assert service.keys["dist_keras/told/worker:0"] == "1"
  return time.monotonic() - started, service


def test_a_chief_that_reported_waits_until_the_others_have_its_line(
    monkeypatch):
  """The service, and the report's text in it, ends with the chief's
  process: a peer that came to a barrier after the chief had exited said
  'lost contact with a peer task' (exit 200, retryable). Worker 1 puts
  its key once it has the line (reports.stopped)."""
  server, address = _listener()
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["127.0.0.1:1", address]},
      "task": {"type": "worker", "index": 1}}))
  not_connected = tf.errors.FailedPreconditionError(
      None, None, "Agent must be in CONNECTED state. It is currently in ERROR.")
  read = []
  reading = threading.Timer(0.3, lambda: read.append(
      reports.stopped(not_connected)))  # Worker 1, at its barrier.
  with server:
    reading.start()
    waited, _ = _chief_reports(monkeypatch, address)
    reading.join()
  assert str(read[0]) == (
      "worker:0 stopped the job: bad data on the chief.")
  assert 0.3 <= waited < reports.TOLD_SECONDS


def test_a_chief_that_reported_waits_not_for_a_peer_that_has_ended(
    monkeypatch):
  """Nothing listens at its address (it died, or has left): at once."""
  server, address = _listener()
  closing = threading.Timer(0.3, server.close)
  closing.start()
  waited, _ = _chief_reports(monkeypatch, address)
  closing.join()
  assert 0.3 <= waited < reports.TOLD_SECONDS


def test_a_chief_that_reported_waits_for_a_silent_peer_only_so_long(
    monkeypatch):
  """A peer that is alive but never reads the report (hung, or busy past
  the wait: it then says it lost contact, as before) holds it no longer."""
  monkeypatch.setattr(reports, "TOLD_SECONDS", 0.5)
  server, address = _listener()
  with server:
    waited, service = _chief_reports(monkeypatch, address)
  assert 0.5 <= waited < 2.5
  assert "dist_keras/told/worker:1" not in service.keys


def test_a_worker_that_reported_puts_its_key_and_waits_not(monkeypatch):
  """The service is not in its process: it leaves at once."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  service = _reporting(monkeypatch)
  monkeypatch.setattr(reports, "TOLD_SECONDS", 60)
  started = time.monotonic()
  reports.report(errors.UserError("bad data"), _WORKER_1)
  assert time.monotonic() - started < 1
  assert service.keys["dist_keras/told/worker:1"] == "1"
