"""A line while one call of steps runs long. The first call of a step
function traces and compiles it (37 s without a line for ResNet-50 on a
2-core CPU, minutes under XLA or on a TPU), and one call of a slow model's
many steps can take minutes: the heartbeat between calls (actions.Progress)
cannot speak then. Only the host's clock is read, from a daemon thread."""
import contextlib
import threading
import time

from dist_keras.measure import timing


class CallWatch:
  """`with watch.call("tracing ..."):` says `still tracing ... (0:00:30 so
  far)` every `every_seconds` (0: never) while the call runs."""

  def __init__(self, every_seconds: float, say):
    self.every, self.say = every_seconds, say
    self._lock = threading.Lock()
    self._call = None  # (what, when it began, lines said + 1)
    self._closed = threading.Event()
    self._thread = None

  @contextlib.contextmanager
  def call(self, what: str):
    if not self.every:  # Off (log.progress_seconds=0, or no progress).
      yield
      return
    with self._lock:
      self._call = (what, time.monotonic(), 1)
    if self._thread is None:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="dist_keras-call-watch")
      self._thread.start()
    try:
      yield
    finally:
      with self._lock:
        self._call = None

  def close(self) -> None:
    self._closed.set()

  def _watch(self) -> None:
    while not self._closed.wait(min(1.0, self.every)):
      with self._lock:
        if self._call is None:
          continue
        what, began, due = self._call
        ran = time.monotonic() - began
        if ran < self.every * due:
          continue
        self._call = (what, began, due + 1)
      self.say(f"still {what} ({timing.eta(ran)} so far)")
