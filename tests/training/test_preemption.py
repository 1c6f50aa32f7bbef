"""Stop requests (preemption.py): SIGTERM and Ctrl-C checkpoint the step the
run is at and stop it, a second Ctrl-C stops at once, an ignored SIGINT
stays ignored; from the Python API a Ctrl-C is a KeyboardInterrupt after
that checkpoint, a SIGTERM a SystemExit (a script exits 143, one line), and
the same call resumes from it. The command line's
exits are in tests/cli/test_cli.py, the multi-worker agreement in
tests/distribute/test_multi_worker.py."""
import functools
import json
import os
import re
import signal
import subprocess
import sys

import keras
import pytest

import dist_keras
import helpers
import user_task
from dist_keras import api, errors, terminal
from dist_keras.measure import calibration, mfu
from dist_keras.training import preemption, report, run_files

CONFIG = {"train.global_batch_size": user_task.GLOBAL_BATCH,
          "train.steps": 12, "train.log_every": 4,
          "train.checkpoint_every": 100, "eval.every": 0,
          "log.calibration_steps": 0, "log.progress": False}


@pytest.fixture
def ctrl_c_raises():
  """SIGINT and SIGHUP as an interactive Python has them (pytest's workers
  may have them ignored), restored afterwards."""
  previous = {signal.SIGINT: signal.signal(signal.SIGINT,
                                           signal.default_int_handler),
              signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_DFL)}
  yield
  for signum, handler in previous.items():
    signal.signal(signum, handler)


def _raise_in_handler(request, signum):
  """Sends `signum` to this process once `request`'s handler holds it (so
  a handler that was not installed fails the test, not the session)."""
  assert signal.getsignal(signum) == request._on_signal  # pylint: disable=protected-access
  signal.raise_signal(signum)


@pytest.mark.parametrize("signum,said", [
    (signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C (SIGINT)"),
    (signal.SIGHUP, "SIGHUP (the terminal closed)")])
def test_a_signal_is_a_request_to_stop_and_the_handler_goes_after(
    ctrl_c_raises, signum, said):
  before = signal.getsignal(signum)
  with preemption.StopRequest(None, False, 5) as request:
    assert not request.should_stop(1)
    _raise_in_handler(request, signum)
    assert request.signal == signum and request.should_stop(2)
    assert request.describe() == said
  assert signal.getsignal(signum) == before


def test_a_second_ctrl_c_stops_at_once(ctrl_c_raises, capsys):
  with preemption.StopRequest(None, False, 5) as request:
    _raise_in_handler(request, signal.SIGINT)
    assert "Ctrl-C again stops at once" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
      _raise_in_handler(request, signal.SIGINT)


def test_a_sigterm_after_ctrl_c_is_still_the_ctrl_c(ctrl_c_raises):
  with preemption.StopRequest(None, False, 5) as request:
    _raise_in_handler(request, signal.SIGINT)
    _raise_in_handler(request, signal.SIGTERM)  # No KeyboardInterrupt.
  assert request.signal == signal.SIGINT


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_an_ignored_ctrl_c_or_hangup_stays_ignored(signum):
  """A job started in the background (`cmd &`) has SIGINT ignored, one
  under nohup SIGHUP: the terminal's Ctrl-C or hangup is not for it."""
  previous = signal.signal(signum, signal.SIG_IGN)
  try:
    with preemption.StopRequest(None, False, 5) as request:
      assert signal.getsignal(signum) == signal.SIG_IGN
      signal.raise_signal(signum)
      assert not request.requested
    assert signal.getsignal(signum) == signal.SIG_IGN
  finally:
    signal.signal(signum, previous)


def test_only_a_peer_asked_describes_the_peer():
  request = preemption.StopRequest(None, False, 5)
  assert "peer worker" in request.describe() and not request.requested


class _CtrlCAtBatch(keras.callbacks.Callback):
  """Presses Ctrl-C (sends `signum`) once, at the first batch end from
  batch `at` on (a call of several steps is one batch hook)."""

  def __init__(self, at: int, signum=signal.SIGINT):
    super().__init__()
    self.at, self.signum, self.pressed = at, signum, False

  def on_train_batch_end(self, batch, logs=None):
    if batch >= self.at and not self.pressed:
      self.pressed = True
      signal.raise_signal(self.signum)


def test_ctrl_c_in_fit_checkpoints_raises_keyboardinterrupt_and_resumes(
    tmp_path, mirrored, ctrl_c_raises):
  workdir = str(tmp_path)
  with pytest.raises(KeyboardInterrupt) as caught:
    dist_keras.fit(user_task.model_fn, user_task.dataset_fn, workdir=workdir,
                   config=CONFIG, strategy=mirrored,
                   callbacks=[_CtrlCAtBatch(at=4)])
  assert isinstance(caught.value, errors.Interrupted)
  stopped = re.match(r"stopped by Ctrl-C \(SIGINT\) after step (\d+); "
                     r"checkpoint ckpt-(\d+) saved", str(caught.value))
  assert stopped and stopped[1] == stopped[2], str(caught.value)
  step = int(stopped[1])
  assert 5 <= step < 12
  assert (tmp_path / "checkpoints" / f"ckpt-{step}.index").exists()
  assert not (tmp_path / "summary.json").exists()
  result = dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                          workdir=workdir, config=CONFIG, strategy=mirrored)
  assert result.summary["steps"] == 12
  assert len(result.history["loss"]) == 1  # This call's epoch: step -> 12.


def test_once_training_is_done_a_ctrl_c_hurries_the_results(ctrl_c_raises,
                                                             capsys):
  """After the last step's checkpoint: the line says so, and work marked
  skippable (the calibration) is cut short on one host, never under
  multi-worker training (the others would wait in a collective)."""
  with preemption.StopRequest(None, False, 5) as request:
    request.training_done = True
    with pytest.raises(preemption.Skipped), request.skippable():
      _raise_in_handler(request, signal.SIGINT)
    assert ("Ctrl-C: training is done and checkpointed; writing its results"
            in capsys.readouterr().err)
    assert request.agreed()
  with preemption.StopRequest(None, True, 5) as request:
    with request.skippable():
      _raise_in_handler(request, signal.SIGTERM)  # Not skipped.
    assert request.requested


class _CtrlCAtEpochEnd(keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    signal.raise_signal(signal.SIGINT)


def _pressing_ctrl_c_in(monkeypatch):
  """calibration.no_communication_step_ms presses Ctrl-C, then goes on as
  it would (a request it answered late would show as its result)."""
  real = calibration.no_communication_step_ms

  def pressed(*args, **kwargs):
    signal.raise_signal(signal.SIGINT)
    return real(*args, **kwargs)

  monkeypatch.setattr(calibration, "no_communication_step_ms", pressed)


@pytest.mark.parametrize("when", ["at the last step", "while calibrating"])
def test_ctrl_c_after_the_last_step_skips_the_calibration_and_finishes(
    tmp_path, mirrored, ctrl_c_raises, capsys, monkeypatch, when):
  callbacks = [_CtrlCAtEpochEnd()] if when == "at the last step" else []
  if when == "while calibrating":
    _pressing_ctrl_c_in(monkeypatch)
  result = dist_keras.fit(
      user_task.model_fn, user_task.dataset_fn, workdir=str(tmp_path),
      config={**CONFIG, "log.calibration_steps": 50, "log.progress": True},
      strategy=mirrored, callbacks=callbacks)
  assert result.summary["steps"] == 12
  assert result.summary["ideal_step_ms"] is None
  assert "calibration skipped: Ctrl-C (SIGINT)" in capsys.readouterr().out
  assert (tmp_path / "summary.json").exists()
  assert (tmp_path / "model.keras").exists()


class _Killed(Exception):
  """What SIGTERM's default action (the process ends, exit -15) is here."""


@pytest.fixture
def sigterm_kills():
  """SIGTERM as an unhandled one would end the process, but raising
  _Killed (the test session goes on); restored afterwards with SIGINT's
  and SIGHUP's."""
  def killed(signum, frame):  # pylint: disable=unused-argument
    raise _Killed

  previous = {signum: signal.getsignal(signum) for signum in (
      signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
  signal.signal(signal.SIGTERM, killed)
  yield killed
  for signum, handler in previous.items():
    signal.signal(signum, handler)


def _sending(monkeypatch, module, name, *signums):
  """`module.name` sends `signums` to this process, then does its work:
  each signal arrives at that point of the run, whatever the timing."""
  real = getattr(module, name)

  def sending(*args, **kwargs):
    for signum in signums:
      signal.raise_signal(signum)
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, sending)


def _fit(workdir, **kwargs):
  """dist_keras.fit of user_task on CONFIG; Python's own KeyboardInterrupt
  (a Ctrl-C no handler took) fails the test instead of ending pytest."""
  try:
    return dist_keras.fit(kwargs.pop("model_fn", user_task.model_fn),
                          user_task.dataset_fn, workdir=str(workdir),
                          config={**CONFIG, **kwargs.pop("config", {})},
                          **kwargs)
  except KeyboardInterrupt as e:
    if isinstance(e, errors.Interrupted):
      raise
    pytest.fail(f"Python's own KeyboardInterrupt ended the run: {e!r}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_request_while_the_results_are_written_still_writes_them(
    tmp_path, mirrored, ctrl_c_raises, sigterm_kills, capsys, monkeypatch,
    signum):
  """After the last step's checkpoint (errors.md, After the last step):
  model.keras and summary.json are written and the run ends as done (it
  was killed there, -15, and a Ctrl-C said no checkpoint was saved)."""
  _sending(monkeypatch, run_files, "save_model", signum)
  result = _fit(tmp_path, strategy=mirrored)
  assert result.summary["steps"] == 12
  assert sorted(p.name for p in tmp_path.glob("*.keras")) == ["model.keras"]
  assert (tmp_path / "summary.json").exists()
  if signum == signal.SIGINT:
    assert ("Ctrl-C: training is done and checkpointed; writing its results"
            in capsys.readouterr().err)
  assert signal.getsignal(signal.SIGTERM) is sigterm_kills  # Given back.


def test_a_second_ctrl_c_while_the_results_are_written_leaves_them_to_a_rerun(
    tmp_path, mirrored, ctrl_c_raises, monkeypatch):
  _sending(monkeypatch, run_files, "save_model", signal.SIGINT,
           signal.SIGINT)
  with pytest.raises(errors.Interrupted, match=(
      r"^stopped by a second Ctrl-C after the last step's checkpoint, "
      r"before the run's results \(model.keras, summary.json\) were all "
      r"written; rerun the same command to write them.$")):
    _fit(tmp_path, strategy=mirrored)
  assert (tmp_path / "checkpoints" / "ckpt-12.index").exists()
  assert not list(tmp_path.glob("*.keras"))
  assert not (tmp_path / "summary.json").exists()
  monkeypatch.undo()
  assert _fit(tmp_path, strategy=mirrored).summary["steps"] == 12
  assert (tmp_path / "model.keras").exists()


def _model_fn_then(signum):
  """user_task's model_fn, then `signum` while the run builds it."""
  def model_fn():
    model = user_task.model_fn()
    signal.raise_signal(signum)
    return model
  return model_fn


@pytest.mark.parametrize("where", ["building the model", "starting"])
@pytest.mark.parametrize("signum,error,said", [
    (signal.SIGTERM, errors.Preempted, "SIGTERM"),
    (signal.SIGINT, errors.Interrupted, r"Ctrl-C \(SIGINT\)")])
def test_a_stop_request_before_training_stops_the_run_at_once(
    tmp_path, mirrored, ctrl_c_raises, sigterm_kills, monkeypatch, where,
    signum, error, said):
  """From the strategy's creation to the first step: nothing to
  checkpoint, so the run stops where it is, in one line (SIGTERM killed
  it, -15, while the Trainer started, e.g. measuring the MFU peak; a
  model's checks took it for the model's failure). A new workdir stopped
  that early is removed: it held only the lock, config.json and the events
  (while the Trainer started, it was left behind)."""
  workdir = tmp_path / "run"
  model_fn = user_task.model_fn
  if where == "starting":
    _sending(monkeypatch, mfu, "for_run", signum)
  else:
    model_fn = _model_fn_then(signum)
  with pytest.raises(error, match=(
      f"^stopped by {said} before training began; rerun the same command "
      "to resume from the workdir's last checkpoint, if any.$")):
    _fit(workdir, strategy=mirrored, model_fn=model_fn)
  assert not (workdir / "checkpoints").exists()
  assert not workdir.exists()
  assert signal.getsignal(signal.SIGTERM) is sigterm_kills


def test_a_stop_request_after_the_results_are_written_changes_nothing(
    tmp_path, mirrored, ctrl_c_raises, sigterm_kills, capsys, monkeypatch):
  """The last line is being printed: the run is done, and a SIGTERM must
  not make a launcher restart it (it was -15, or 143 after `done:`)."""
  _sending(monkeypatch, report, "footer", signal.SIGTERM, signal.SIGINT,
           signal.SIGINT)
  result = _fit(tmp_path, strategy=mirrored, config={"log.progress": True})
  assert result.summary["steps"] == 12
  assert "Ctrl-C" not in capsys.readouterr().err


def test_sigterm_in_fit_is_preempted_exit_143_said_in_one_line_and_catchable(
    tmp_path, mirrored, sigterm_kills, capsys):
  """What a script's uncaught SystemExit does, a preemption in fit does:
  exit 143, which a launcher restarts (a RuntimeError's exit 1 read as a
  bug), no traceback; fit says its line first, as the command line does.
  `except dist_keras.errors.Preempted` still catches it; `except
  Exception`, a script's handling of its own failures, does not."""
  caught = None
  try:
    _fit(tmp_path, strategy=mirrored,
         callbacks=[_CtrlCAtBatch(at=4, signum=signal.SIGTERM)])
  except Exception:  # pylint: disable=broad-except
    pytest.fail("an `except Exception` took the preemption for a failure")
  except dist_keras.errors.Preempted as e:
    caught = e
  assert isinstance(caught, SystemExit) and caught.code == 143
  stopped = re.match(r"stopped by SIGTERM after step (\d+); checkpoint "
                     r"ckpt-(\d+) saved in \S+; rerun the same command to "
                     r"resume from it.$", str(caught))
  assert stopped and stopped[1] == stopped[2], str(caught)
  assert (tmp_path / "checkpoints" / f"ckpt-{stopped[1]}.index").exists()
  assert capsys.readouterr().err.splitlines()[-1] == (
      f"dist_keras: error: {caught}")
  assert signal.getsignal(signal.SIGTERM) is sigterm_kills  # Given back.


# A user's script: dist_keras.fit until SIGTERM (CONFIG, one device, a line
# a step), with a handler of its own at exit.
_USER_SCRIPT = """
import atexit, json, sys
import dist_keras, user_task
atexit.register(lambda: print("the script's atexit handler ran"))
dist_keras.fit(user_task.model_fn, user_task.dataset_fn, workdir=sys.argv[1],
               strategy="one_device", config=json.loads(sys.argv[2]))
"""


def test_sigterm_ends_a_fit_script_with_143_and_its_line_and_a_rerun_resumes(
    tmp_path, capsys):
  """A pod's preemption of a script that calls fit and catches nothing:
  the step is checkpointed, the script exits 143 (it exited 1 with a
  38-line traceback: no restart), stderr ends with the one line, the
  script's atexit handlers run, and a rerun resumes from that step."""
  script = tmp_path / "train_mine.py"
  script.write_text(_USER_SCRIPT)
  workdir = tmp_path / "run"
  config = {**CONFIG, "train.steps": 100000, "train.log_every": 1,
            "log.progress": True}
  proc = subprocess.Popen(
      [sys.executable, str(script), str(workdir), json.dumps(config)],
      cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([helpers.REPO, helpers.TESTS])))
  for line in proc.stdout:
    if line.startswith("step"):
      break
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == errors.EXIT_PREEMPTED, stderr[-2000:]
  assert "Traceback" not in stderr, stderr[-2000:]
  last = stderr.strip().splitlines()[-1]
  stopped = re.match(r"dist_keras: error: stopped by SIGTERM after step "
                     r"(\d+); checkpoint ckpt-(\d+) saved in (\S+); rerun "
                     r"the same command to resume from it.$", last)
  assert stopped and stopped[1] == stopped[2], last
  assert stopped[3] == str(workdir / "checkpoints")
  assert "the script's atexit handler ran" in stdout
  step = int(stopped[1])
  result = helpers.fit_fns(user_task.model_fn, user_task.dataset_fn, workdir,
                           {**config, "train.steps": step + 2})
  assert f"resumed from ckpt-{step} at step {step}" in capsys.readouterr().out
  assert result.summary["steps"] == step + 2


# A user's script: dist_keras.fit until Ctrl-C; "caught" catches it (as
# `except dist_keras.errors.Interrupted`) and then fails on its own.
_CTRL_C_SCRIPT = """
import atexit, json, sys
import dist_keras, user_task
atexit.register(lambda: print("the script's atexit handler ran"))
try:
  dist_keras.fit(user_task.model_fn, user_task.dataset_fn, workdir=sys.argv[1],
                 strategy="one_device", config=json.loads(sys.argv[2]))
except dist_keras.errors.Interrupted:
  if sys.argv[3] != "caught":
    raise
  print("the script caught it")
raise ValueError("the script's own error")
"""


@pytest.mark.parametrize("catches", ["uncaught", "caught"])
def test_ctrl_c_ends_a_fit_script_as_ctrl_c_ends_python_unless_it_is_caught(
    tmp_path, catches):
  """Ctrl-C in a script that calls fit and catches nothing: the step is
  checkpointed and the script dies by SIGINT (130 to a shell) with fit's
  one line and its atexit handlers run, as a plain Python script's Ctrl-C
  ends it (a KeyboardInterrupt subclass made it exit 1 with a 30-line
  traceback). A script that catches it goes on; its own later error is
  Python's as ever (a traceback, exit 1)."""
  script = tmp_path / "train_mine.py"
  script.write_text(_CTRL_C_SCRIPT)
  config = {**CONFIG, "train.steps": 100000, "train.log_every": 1,
            "log.progress": True}
  proc = subprocess.Popen(
      [sys.executable, str(script), str(tmp_path / "run"), json.dumps(config),
       catches], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      # A terminal's foreground job: SIGINT at its default (pytest's own
      # process may ignore it).
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([helpers.REPO, helpers.TESTS])))
  for line in proc.stdout:
    if line.startswith("step"):
      break
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=120)
  assert "the script's atexit handler ran" in stdout, stdout[-2000:]
  if catches == "caught":
    assert proc.returncode == 1, stderr[-2000:]
    assert "the script caught it" in stdout
    assert stderr.strip().splitlines()[-1] == (
        "ValueError: the script's own error"), stderr[-2000:]
    return
  assert proc.returncode == -signal.SIGINT, stderr[-2000:]
  assert "Traceback" not in stderr, stderr[-2000:]
  last = stderr.strip().splitlines()[-1]
  assert re.match(r"dist_keras: error: stopped by Ctrl-C \(SIGINT\) after "
                  r"step (\d+); checkpoint ckpt-\1 saved in \S+; rerun the "
                  r"same command to resume from it.$", last), last


def test_the_hook_ends_only_fits_interrupted_and_not_in_ipython(monkeypatch):
  """sys.excepthook hands any other error, a plain KeyboardInterrupt
  too, to the hook it replaced; in IPython it is not set at all."""
  seen = []
  monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a[1]))
  preemption.end_as_ctrl_c_if_uncaught(errors.Interrupted("fit's"))
  others = [errors.Interrupted("another"), KeyboardInterrupt(), ValueError()]
  for other in others:
    sys.excepthook(type(other), other, None)
  assert seen == others
  shell = type(sys)("IPython")
  shell.get_ipython = object
  monkeypatch.setitem(sys.modules, "IPython", shell)
  monkeypatch.setattr(sys, "excepthook", seen.append)
  preemption.end_as_ctrl_c_if_uncaught(errors.Interrupted("in a notebook"))
  assert sys.excepthook == seen.append


def test_the_command_lines_run_keeps_the_handler_to_its_exit(
    tmp_path, mirrored, sigterm_kills, monkeypatch):
  """The command line's process ends with the run: its handler stays (a
  SIGTERM between the last line and the exit was -15); fit gives the
  caller's back (the other tests)."""
  monkeypatch.setattr(api, "Job", functools.partial(api.Job, to_exit=True))
  assert _fit(tmp_path, strategy=mirrored).summary["steps"] == 12
  assert signal.getsignal(signal.SIGTERM) is not sigterm_kills
  signal.raise_signal(signal.SIGTERM)  # Nothing happens.
  signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("closed", ["pipe", "full", "None", "stream"])
@pytest.mark.parametrize("err", [False, True])
def test_a_failing_stdout_costs_its_lines_only(monkeypatch, closed, err):
  """EPIPE (a `| head` that has gone) or ENOSPC (/dev/full): that stream
  goes to /dev/null and the run goes on; one closed when Python started
  is None; a stream object closed since raises ValueError. Stderr alike."""
  if closed == "full" and not os.path.exists("/dev/full"):
    pytest.skip("no /dev/full here")
  reader, writer = os.pipe()
  os.close(reader)
  if closed == "full":
    os.close(writer)
    writer = os.open("/dev/full", os.O_WRONLY)
  stream = open(writer, "w", encoding="utf-8")  # pylint: disable=consider-using-with
  if closed == "stream":
    stream.close()
  monkeypatch.setattr(sys, "stderr" if err else "stdout",
                      None if closed == "None" else stream)
  try:
    terminal.say("a line nobody reads", err=err)
    terminal.say("and the next", err=err)
    if closed in ("pipe", "full"):
      assert os.path.samestat(os.fstat(writer), os.stat(os.devnull))
  finally:
    monkeypatch.undo()
    stream.close()
