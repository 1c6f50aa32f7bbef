"""TF profiler traces of chosen train steps (log.profile_steps)."""
import contextlib

import tensorflow as tf

from dist_keras import validate


class Profiler:
  """TF profiler trace of train steps START..STOP on the chief.

  Each step is marked (`Trace(step_num=...)`) so tools/profile_collectives.py
  can tie collectives to steps; the trace stops one step after STOP because
  the last step's collective events are written just after it returns.
  """

  def __init__(self, spec: str, logdir: str, chief: bool):
    self.start, self.stop = validate.profile_steps(spec)
    self.logdir, self.enabled, self.active = logdir, chief and self.start, False

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    """Stops a trace still running when training ends (STOP near the end)."""
    if self.active:
      tf.profiler.experimental.stop()
      self.active = False

  def step(self, step: int):
    if not self.enabled:
      return contextlib.nullcontext()
    if step == self.start:
      tf.profiler.experimental.start(self.logdir)
      self.active = True
    elif self.active and step == self.stop + 2:
      tf.profiler.experimental.stop()
      self.active = False
    if self.active and step <= self.stop:
      return tf.profiler.experimental.Trace("train", step_num=step, _r=1)
    return contextlib.nullcontext()
