"""The model's metrics read as Keras' `fit` reports them: over a log window,
over an epoch, and for one eval pass.

Keras keeps every metric's state in SUM-aggregated on-read variables (totals
and counts), so that a cross-replica read is the job's state. Those states
add up across windows too: the loop reads the state once per log window and
computes the window's values from the difference with the last read, while
the model's metrics keep running over the whole epoch, as under `fit` (a
callback reading `model.metrics` sees fit's epoch-to-date values).
"""
import keras
import numpy as np
import tensorflow as tf


class MetricState:
  """Reads the model's metric state and computes metric values from it."""

  def __init__(self, model):
    self.model = model
    self.variables = list(model.metrics_variables)
    # Cross-replica context: each variable's value summed over every replica
    # and worker. Under MultiWorkerMirroredStrategy this is a collective:
    # every worker reads at the same points.
    self._read = tf.function(
        lambda: [tf.identity(v.value) for v in self.variables],
        autograph=False)

  def read(self) -> list:
    """The job's metric state now: one array per metric variable."""
    if not self.variables:
      return []
    return [np.asarray(t) for t in self._read()]

  def results(self, state) -> dict:
    """{name: value} of `model.get_metrics_result()` for `state`, as `fit`
    logs them: a float, or a numpy array for a metric whose result is one
    (F1Score(average=None): a value per class)."""
    mapping = [(v, tf.constant(s, dtype=v.dtype))
               for v, s in zip(self.variables, state)]
    with keras.StatelessScope(state_mapping=mapping):
      # Converted inside the scope: a result() that returns its variable
      # itself (the Keras guide's CategoricalTruePositives) reads `state`
      # only here; outside, it would read the live (or per-replica) one.
      values = {name: np.asarray(value)
                for name, value in self.model.get_metrics_result().items()}
    return {name: logged(value) for name, value in values.items()}


def logged(value):
  """A metric's (or a model's own train_step's) value as Keras' fit logs
  it (python_utils.pythonify_logs): a float where float() takes it, else
  the numpy array (a value per class)."""
  value = np.asarray(value)
  return float(value.reshape(())) if value.size == 1 else value


class TrainMetrics:
  """The train metrics of the log windows and of the epoch."""

  def __init__(self, state: MetricState):
    self.state = state
    self._last = None  # The state at the last window's end.
    self._read = (None, None)  # (step, state) of the latest read.

  def start_epoch(self) -> None:
    """Resets the model's metrics, as `fit` does when an epoch begins."""
    self.state.model.reset_metrics()
    self._last, self._read = None, (None, None)

  def forget_window(self) -> None:
    """Forgets the epoch's metrics so far (they hold a diverged step's)."""
    self.start_epoch()

  def _state_at(self, step: int) -> list:
    """The state after `step`, read once however often it is asked for."""
    if self._read[0] != step:
      self._read = (step, self.state.read())
    return self._read[1]

  def window(self, step: int) -> dict:
    """The values of the steps since the last window, up to `step` ({} if
    nothing was measured since: a window that a divergence emptied)."""
    now = self._state_at(step)
    last = self._last or [np.zeros_like(s) for s in now]
    self._last = now
    window = [n - b for n, b in zip(now, last)]
    if not any(np.any(w) for w in window):
      return {}
    return self.state.results(window)

  def epoch(self, step: int) -> dict:
    """The values since the epoch began, up to `step`: `fit`'s epoch logs
    (and its batch logs: the epoch's running values)."""
    return self.state.results(self._state_at(step))
