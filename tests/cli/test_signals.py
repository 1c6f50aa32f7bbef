"""dist_keras/signals.py: the rules every stop-signal handler of dist_keras
follows (the wait for peers, a run's stop request, a cluster's leaving,
the launcher), checked once here."""
import signal
import threading

import pytest

from dist_keras import signals


@pytest.fixture(name="sigusr")
def _sigusr():
  """SIGUSR1 and SIGUSR2 at their default action, put back after."""
  previous = {s: signal.signal(s, signal.SIG_DFL)
              for s in (signal.SIGUSR1, signal.SIGUSR2)}
  yield tuple(previous)
  for signum, handler in previous.items():
    signal.signal(signum, handler)


def _handler(signum, frame):  # pylint: disable=unused-argument
  pass


def test_caught_sets_the_handler_and_puts_back_the_one_before(sigusr):
  mine = lambda *args: None  # pylint: disable=unnecessary-lambda-assignment
  signal.signal(signal.SIGUSR1, mine)
  with pytest.raises(RuntimeError):
    with signals.caught(_handler, sigusr):
      assert [signal.getsignal(s) for s in sigusr] == [_handler] * 2
      raise RuntimeError("the block failed")
  assert signal.getsignal(signal.SIGUSR1) is mine
  assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def test_an_ignored_signal_stays_ignored_unless_named(sigusr):
  for signum in sigusr:
    signal.signal(signum, signal.SIG_IGN)
  previous = signals.take(_handler, sigusr, take_ignored=(signal.SIGUSR2,))
  assert previous == {signal.SIGUSR2: signal.SIG_IGN}
  assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
  assert signal.getsignal(signal.SIGUSR2) is _handler
  signals.put_back(previous)
  assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN


def test_a_handler_set_outside_python_is_left(sigusr, monkeypatch):
  """signal.getsignal's None: Python could not put it back."""
  real = signal.getsignal
  monkeypatch.setattr(signal, "getsignal", lambda s: (
      None if s == signal.SIGUSR1 else real(s)))
  assert list(signals.take(_handler, sigusr)) == [signal.SIGUSR2]
  assert real(signal.SIGUSR1) is signal.SIG_DFL


def test_outside_the_main_thread_nothing_is_set(sigusr):
  """Python sets handlers in the main thread only (elsewhere signal.signal
  raises ValueError): a notebook's worker thread keeps its process's."""
  taken = []
  thread = threading.Thread(target=lambda: taken.append(
      signals.take(_handler, sigusr)))
  thread.start()
  thread.join()
  assert taken == [{}]
  assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_kept_sets_pythons_handlers_again_after_the_block(sigusr,
                                                          monkeypatch):
  """C code (TensorFlow's SIGTERM notifier) replaces a handler unseen by
  Python; setting Python's again is what puts it back."""
  real, set_again = signal.signal, []
  monkeypatch.setattr(signal, "signal", lambda s, h: (
      set_again.append((s, h)) or real(s, h)))
  with signals.kept(sigusr):
    assert not set_again
  assert set_again == [(s, signal.SIG_DFL) for s in sigusr]
