"""Handlers of the stop signals (SIGTERM, Ctrl-C's SIGINT, SIGHUP) set for
a while and put back after: the wait for a cluster's peers
(distribute/rendezvous.py), a run's stop request (training/preemption.py),
a finished cluster's leaving (train.py), the launcher (launch/cli.py).

They share four rules:
- Python sets and runs signal handlers in the main thread only: elsewhere
  (a notebook's worker thread, a Ray Train worker) nothing is set, and the
  process keeps the handlers it has.
- A signal ignored when the handler would be set stays ignored (a job
  started in the background, `cmd &`, has SIGINT ignored; one under
  nohup, SIGHUP): it is not the terminal's to stop. A caller takes an
  ignored signal only where it names it (`take_ignored`).
- A handler set outside Python (signal.getsignal says None) is left as it
  is: Python could not put it back.
- Only what was set is put back.
"""
import contextlib
import signal
import threading


def _in_main_thread() -> bool:
  return threading.current_thread() is threading.main_thread()


def take(handler, signums, take_ignored=()) -> dict:
  """Sets `handler` (a function, signal.SIG_DFL or SIG_IGN) for each of
  `signums` the rules above allow, `take_ignored` even where ignored.

  Returns:
    {signum: its handler before} for each one set: put_back's argument.
  """
  if not _in_main_thread():
    return {}
  previous = {}
  for signum in signums:
    before = signal.getsignal(signum)
    if before is None or (before is signal.SIG_IGN
                          and signum not in take_ignored):
      continue
    previous[signum] = signal.signal(signum, handler)
  return previous


def put_back(previous: dict) -> None:
  """Sets again each handler of `previous` ({signum: handler}, as take()
  returns it), in the main thread."""
  if not _in_main_thread():
    return
  for signum, handler in previous.items():
    signal.signal(signum, handler)


@contextlib.contextmanager
def caught(handler, signums, take_ignored=()):
  """`handler` for `signums` while the block runs (take()), the handlers
  before it put back after, whatever the block raised."""
  previous = take(handler, signums, take_ignored)
  try:
    yield
  finally:
    put_back(previous)


@contextlib.contextmanager
def kept(signums):
  """Sets again after the block each of `signums`' handlers Python had
  before it: a handler that C code (TensorFlow's) replaced meanwhile,
  unseen by Python's signal.getsignal, is Python's again."""
  before = {signum: signal.getsignal(signum) for signum in signums}
  try:
    yield
  finally:
    put_back({s: h for s, h in before.items() if h is not None})
