"""Stop requests: SIGTERM means "checkpoint now and exit so I can be
retried"; Ctrl-C (SIGINT) means the same, asked by the user at the terminal;
SIGHUP, the terminal (an ssh session) gone.

Kubernetes, Slurm and spot VMs send SIGTERM before they kill a job; a user
presses Ctrl-C. Either way the loop checkpoints the step it is at rather
than losing the work since the last scheduled checkpoint; a second Ctrl-C
stops at once, without it (Python's own KeyboardInterrupt). The loop asks
`should_stop(step)` after every step; on one host the signal's flag answers
at once. Under multi-worker training every worker must stop at the SAME step
(a worker that leaves early strands the others in a collective), and the
signal may reach only one of them, so the workers agree with one tiny
all-reduce every `agree_every` steps instead of every step.

The handler covers the whole run (api.build installs it once the strategy
exists, the Trainer's close puts the previous one back, or, on the command
line, keeps it to the process's exit), in three windows: before training
begins a request stops the run at once (there is no step to checkpoint);
while training, at the next step boundary with a checkpoint; after the last
step's checkpoint it only hurries the results along, and once they are
written it changes nothing.
"""
import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref

from dist_keras import errors, signals, terminal
from dist_keras.training import allreduce

_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)",
          signal.SIGHUP: "SIGHUP (the terminal closed)"}


class Skipped(KeyboardInterrupt):
  """A stop request inside work that may be cut short (StopRequest.
  skippable): the work is dropped, the run goes on to write its results."""


class StoppedAtOnce(KeyboardInterrupt):
  """A stop request before training began: raised where the run was (a
  KeyboardInterrupt, so that no `except Exception` of the model's or data's
  checks takes it for their failure); `error()` is what the run raises."""

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum

  def error(self) -> Exception:
    return _kind(self.signum)(
        f"stopped by {_NAMES[self.signum]} before training began; rerun the "
        "same command to resume from the workdir's last checkpoint, if any.")


def _kind(signum) -> type:
  """Interrupted for a Ctrl-C, else Preempted (SIGTERM, SIGHUP, a peer's)."""
  return errors.Interrupted if signum == signal.SIGINT else errors.Preempted


class StopRequest:
  """Catches SIGTERM, SIGINT and SIGHUP for a run (a `with`); tells the
  loop when to stop.

  Attributes:
    signal: the first signal this process received (signal.SIGTERM,
      SIGINT or SIGHUP), or None (none, or only a peer worker got one).
  """

  def __init__(self, strategy, multi_worker: bool, agree_every: int,
               keep: bool = False, before_training: bool = False):
    self.strategy, self.multi_worker = strategy, multi_worker
    self.agree_every = agree_every
    self.signal = None
    # Before training begins a request stops the run where it is: nothing
    # of it needs a checkpoint, and a model's build or a restore can take
    # minutes.
    self.before_training = before_training
    # Once the last step is checkpointed, a stop request only hurries the
    # results along: nothing is left to stop.
    self.training_done = False
    # Once the results are written (or the run failed), a request changes
    # nothing: the run's exit code is decided.
    self.ended = False
    # The command line keeps the handler to the process's exit: a SIGTERM
    # after a finished run's last line must not make it exit -15.
    self._keep = keep
    self._skippable = False
    self._previous = {}
    self._agree = None

  @property
  def requested(self) -> bool:
    return self.signal is not None

  def __enter__(self):
    # In the main thread only; an ignored SIGINT or SIGHUP stays ignored
    # (dist_keras/signals.py). SIGTERM is taken even where ignored: it asks
    # for a checkpoint.
    self._previous = signals.take(self._on_signal, _NAMES,
                                  take_ignored=(signal.SIGTERM,))
    return self

  def __exit__(self, *exc_info):
    self.ended = True
    if self._keep:
      return
    signals.put_back(self._previous)
    self._previous = {}

  def _on_signal(self, signum, frame):  # pylint: disable=unused-argument
    if signum == signal.SIGHUP:
      terminal.silence(terminal.terminals((1, 2)))
    if self.ended:
      return
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      # The second Ctrl-C: stop now.
      if self.training_done:
        raise errors.Interrupted(
            "stopped by a second Ctrl-C after the last step's checkpoint, "
            "before the run's results (model.keras, summary.json) were all "
            "written; rerun the same command to write them.")
      raise KeyboardInterrupt
    self.signal = self.signal or signum
    if self.before_training:
      raise StoppedAtOnce(signum)
    if signum == signal.SIGINT:
      terminal.say("dist_keras: Ctrl-C: " + (
          "training is done and checkpointed; writing its results (Ctrl-C "
          "again stops at once: a rerun then writes them)"
          if self.training_done else "stopping after this step with a "
          "checkpoint (Ctrl-C again stops at once, without one)"), err=True)
    if self._skippable:
      raise Skipped

  @contextlib.contextmanager
  def skippable(self):
    """Work after training that a stop request cuts short on one host (the
    calibration): the request raises Skipped inside it. Not under
    multi-worker training: a worker that left its collectives would strand
    the others."""
    self._skippable = not self.multi_worker
    try:
      yield
    finally:
      self._skippable = False

  def describe(self) -> str:
    """What asked this process to stop, for its last line."""
    if self.signal is None:
      return "a peer worker's stop request (SIGTERM, Ctrl-C or SIGHUP)"
    return _NAMES[self.signal]

  def error(self, step: int, checkpoint: str) -> Exception:
    """What the run raises when it stops after `step`, with `checkpoint`
    (its path) saved."""
    folder, name = os.path.split(checkpoint)
    return _kind(self.signal)(
        f"stopped by {self.describe()} after step {step}; checkpoint {name} "
        f"saved in {folder}; rerun the same command to resume from it.")

  def should_stop(self, step: int) -> bool:
    """Whether every worker stops after `step` (same answer on all)."""
    if self.multi_worker and step % self.agree_every:
      return False
    return self.agreed()

  def agreed(self) -> bool:
    """Whether any worker was asked to stop (a collective under multi-worker
    training: every worker must call it at the same point)."""
    return self._anyone_requested() if self.multi_worker else self.requested

  def _anyone_requested(self) -> bool:
    if self._agree is None:
      self._agree = allreduce.any_worker(self.strategy)
    return self._agree(self.requested)


# Interrupted errors a fit call raised, which end a script that does not
# catch them as Ctrl-C ends one (end_as_ctrl_c_if_uncaught).
_ENDS_AS_CTRL_C = weakref.WeakSet()


def end_as_ctrl_c_if_uncaught(error: errors.Interrupted) -> None:
  """Makes `error`, raised out of dist_keras.fit, end the script as an
  uncaught Ctrl-C ends a Python script (its one line, no traceback, killed
  by SIGINT: 130 to a shell) if nothing catches it. CPython does that for
  exactly KeyboardInterrupt only (it compares the type), so a subclass
  exited 1 with a traceback. A script's `except KeyboardInterrupt` (or
  Interrupted) still catches it; sys.excepthook, which only an uncaught
  error reaches, handles this object alone and hands any other error to
  the hook it replaced. Not in IPython (a notebook shows the cell's
  KeyboardInterrupt), nor under `python -i` (which stays)."""
  shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)
  if shell() is not None or sys.flags.interactive:
    return
  _ENDS_AS_CTRL_C.add(error)
  if getattr(sys.excepthook, "ends_as_ctrl_c", False):
    return

  def hook(kind, value, traceback):
    if value not in _ENDS_AS_CTRL_C:
      return previous(kind, value, traceback)
    terminal.error(str(value))
    return _exit_as_ctrl_c()

  previous, hook.ends_as_ctrl_c = sys.excepthook, True
  sys.excepthook = hook


def _exit_as_ctrl_c() -> None:
  """What CPython does after an uncaught KeyboardInterrupt: the exit's
  own steps (non-daemon threads joined, then the atexit handlers: the
  script's own, a cluster's leaving.at_exit), then death by SIGINT under
  its default action. The interpreter's teardown is left out, as the
  command line's exit leaves it: destroying a stopped input pipeline can
  wait seconds for tf.data's threads."""
  threading._shutdown()  # pylint: disable=protected-access
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  terminal.flush()
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.raise_signal(signal.SIGINT)
  os._exit(errors.EXIT_INTERRUPTED)  # SIGINT blocked in this thread.
