"""Preemption: SIGTERM means "checkpoint now and exit so I can be retried".

Kubernetes, Slurm and spot VMs send SIGTERM before they kill a job. The loop
asks `should_stop(step)` after every step; on one host the signal's flag
answers at once. Under multi-worker training every worker must stop at the
SAME step (a worker that leaves early strands the others in a collective),
and the signal may reach only one of them, so the workers agree with one
tiny all-reduce every `agree_every` steps instead of every step.
"""
import signal
import threading

from dist_keras.training import allreduce


class StopRequest:
  """Catches SIGTERM while training; tells the loop when to stop."""

  def __init__(self, strategy, multi_worker: bool, agree_every: int):
    self.strategy, self.multi_worker = strategy, multi_worker
    self.agree_every = agree_every
    self.requested = False
    self._previous = None
    self._agree = None

  def __enter__(self):
    # Python runs signal handlers in the main thread only; elsewhere (e.g. a
    # notebook's worker thread) SIGTERM keeps its default action.
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def __exit__(self, *exc_info):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _on_sigterm(self, signum, frame):  # pylint: disable=unused-argument
    self.requested = True

  def should_stop(self, step: int) -> bool:
    """Whether every worker stops after `step` (same answer on all)."""
    if not self.multi_worker:
      return self.requested
    if step % self.agree_every:
      return False
    return self._anyone_requested()

  def _anyone_requested(self) -> bool:
    if self._agree is None:
      self._agree = allreduce.host_value_sum(self.strategy)
    return self._agree(float(self.requested)) > 0
