"""A finished run's train iterator, let go of without making its caller
wait.

Destroying an iterator whose pipeline autotunes waits until tf.data's
autotune thread next wakes (TF 2.21: ~RootDataset::Iterator joins that
thread, whose sleep grows with the run to 60 s; cancelling the iterator
does not wake it): `dist_keras.fit` returned 1-60 s after its run's last
step, the process idle. The run hands its iterator to `hold`, which
destroys it on a thread of its own (the wait is outside Python's lock:
the caller goes on meanwhile); the command line, which ends with os._exit,
keeps it instead (`keep_until_exit`).
"""
import atexit
import os
import queue
import sys
import threading

# How often the thread looks whether the run still refers to an iterator
# it holds (its frame does as it hands it over), while it holds one.
_POLL_SECONDS = 0.05


class _Dropper:
  """One thread that destroys the iterators given to it, one at a time,
  each once nothing else refers to it."""

  def __init__(self):
    self._given = queue.SimpleQueue()
    # Held while the thread destroys; close() takes it for good.
    self._dropping = threading.Lock()
    self.thread = threading.Thread(target=self._drop, daemon=True,
                                   name="dist_keras-drop-iterators")
    self.thread.start()

  def give(self, iterator) -> None:
    self._given.put(iterator)

  def _drop(self) -> None:
    held = []
    while True:
      try:
        held.append(self._given.get(timeout=_POLL_SECONDS if held else None))
      except queue.Empty:
        pass
      with self._dropping:
        # Ours alone: the list's, the comprehension's name and
        # getrefcount's argument; the old list goes, and its others with it.
        held = [it for it in held if sys.getrefcount(it) > 3]

  def close(self) -> None:
    """At exit: waits out a destruction under way (a daemon thread inside
    one as Python ends aborts the process: "terminate called ... exception
    not rethrown"), then stops the thread for good. What it still holds
    is never destroyed: its frame, and the queue its `self` refers to,
    outlive Python's end, as the command line's kept list does."""
    self._dropping.acquire()


# keep_until_exit's list, or the _Dropper, made at the first `hold`.
_KEPT: list | None = None
_DROPPER: _Dropper | None = None
_MADE = threading.Lock()


def keep_until_exit() -> None:
  """From now on `hold` keeps the iterators it is given, never destroyed:
  for a process that ends with os._exit (the command line)."""
  global _KEPT
  if _KEPT is None:
    _KEPT = []


def hold(iterator) -> None:
  """A finished iterator, which its caller is about to let go of: kept
  under keep_until_exit, else destroyed on the process's dropping thread
  once the caller no longer refers to it."""
  global _DROPPER
  if _KEPT is not None:
    _KEPT.append(iterator)
    return
  with _MADE:
    if _DROPPER is None:
      _DROPPER = _Dropper()
  _DROPPER.give(iterator)


def _forget_dropper() -> None:
  """A forked child has none of its parent's threads: its own at its first
  hold."""
  global _DROPPER, _MADE
  _DROPPER, _MADE = None, threading.Lock()


def _at_exit() -> None:
  if _DROPPER is not None:
    _DROPPER.close()


os.register_at_fork(after_in_child=_forget_dropper)
# Registered as the module is imported, before any run: a cluster's
# leaving (registered by its fit, so called earlier) is unaffected.
atexit.register(_at_exit)
