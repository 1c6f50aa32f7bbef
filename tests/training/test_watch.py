"""dist_keras/training/watch.py: lines while one call of steps runs long."""
import time

from dist_keras.training import watch


def test_a_long_call_is_said_every_period_and_a_finished_one_is_not():
  said = []
  call_watch = watch.CallWatch(0.2, said.append)
  try:
    with call_watch.call("tracing and compiling the plain step function"):
      time.sleep(0.7)
    lines = list(said)
    time.sleep(0.5)  # Between calls: nothing.
    with call_watch.call("running a call of 5 steps"):
      pass  # Quick: nothing.
    time.sleep(0.3)
  finally:
    call_watch.close()
  assert 2 <= len(lines) <= 4, lines
  assert lines[0] == ("still tracing and compiling the plain step function "
                      "(0:00:00 so far)")
  assert said == lines


def test_off_it_starts_no_thread_and_says_nothing():
  said = []
  call_watch = watch.CallWatch(0, said.append)
  with call_watch.call("evaluating"):
    time.sleep(0.2)
  call_watch.close()
  assert said == [] and call_watch._thread is None  # pylint: disable=protected-access
