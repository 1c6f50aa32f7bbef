"""Stop requests (preemption.py): SIGTERM and Ctrl-C checkpoint the step the
run is at and stop it, a second Ctrl-C stops at once, an ignored SIGINT
stays ignored; from the Python API a Ctrl-C is a KeyboardInterrupt after
that checkpoint, and the same call resumes from it. The command line's
exits are in tests/cli/test_cli.py, the multi-worker agreement in
tests/distribute/test_multi_worker.py."""
import re
import signal

import keras
import pytest

import dist_keras
import user_task
from dist_keras import errors
from dist_keras.measure import calibration
from dist_keras.training import preemption

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
  """Presses Ctrl-C once, at the first batch end from batch `at` on (a call
  of several steps is one batch hook)."""

  def __init__(self, at: int):
    super().__init__()
    self.at, self.pressed = at, False

  def on_train_batch_end(self, batch, logs=None):
    if batch >= self.at and not self.pressed:
      self.pressed = True
      signal.raise_signal(signal.SIGINT)


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
