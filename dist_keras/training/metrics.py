"""The model's metrics read as Keras' `fit` reports them: over a log window,
over an epoch, and for one eval pass.

Keras keeps every metric's state in SUM-aggregated on-read variables (totals
and counts), so that a cross-replica read is the job's state. Those states
add up across windows too: the loop reads the state once per log window and
computes the window's values from the difference with the last read, while
the model's metrics keep running over the whole epoch, as under `fit` (a
callback reading `model.metrics` sees fit's epoch-to-date values).

A run resumed mid-epoch goes on with the epoch's state as its checkpoint
kept it (run_record.py), and the last window's end: its epoch values, its
first window and a callback's decisions are an uninterrupted run's.
"""
import keras
import numpy as np
import tensorflow as tf

from dist_keras.training import keras_internals


class MetricState:
  """Reads the model's metric state and computes metric values from it."""

  def __init__(self, model):
    self.model = model
    self.variables = list(model.metrics_variables)
    # Cross-replica context: each variable's value summed over every replica
    # and worker. Under MultiWorkerMirroredStrategy this is a collective:
    # every worker reads at the same points.
    self._read = keras_internals.made_per_run(tf.function(
        lambda: [tf.identity(v.value) for v in self.variables],
        autograph=False))
    place = {id(v): i for i, v in enumerate(self.variables)}
    # Each metric's variables' places in a state: what tells whether the
    # steps updated it.
    self._places = [(m, [place[id(v)] for v in m.variables if id(v) in place])
                    for m in model.metrics]

  def read(self) -> list:
    """The job's metric state now: one array per metric variable."""
    if not self.variables:
      return []
    return [np.asarray(t) for t in self._read()]

  def assign(self, state) -> None:
    """Sets the model's metric state to `state` (read()'s arrays). In the
    cross-replica context TF sets each replica's part so that a read gives
    `state` back (a SUM-aggregated variable: `state` / replicas each)."""
    for variable, value in zip(self.variables, state):
      variable.assign(value)

  def signature(self) -> list:
    """What a kept state must match to be this model's: each variable's
    name and shape (its path is numbered by the process's other models)."""
    return [[v.name, list(v.shape)] for v in self.variables]

  def results(self, state, step_logs=None) -> dict:
    """{name: value} of `model.get_metrics_result()` for `state`, as `fit`
    logs them: a float, or a numpy array for a metric whose result is one
    (F1Score(average=None): a value per class).

    With `step_logs`, the last logs of a model's own train_step or
    test_step, these are reported as `fit` and `evaluate` report them
    (Keras' _get_metrics_result_or_logs): the metrics where the logs name
    the metrics, else the logs. A name of a metric the steps updated is
    still read from its state, the job's exact value (the replicas' mean
    of their own F1 scores is not the global batch's F1); one of a metric
    they never touched (Keras' own loss tracker, beside a step's own
    "loss") is the step's value."""
    values = self._results(state)
    if not step_logs or set(step_logs) == set(values):
      return values
    touched = self._touched(state)
    return {name: values[name] if touched.get(name, name in values)
            else value for name, value in step_logs.items()}

  def _mapping(self, state) -> list:
    return [(v, tf.constant(s, dtype=v.dtype))
            for v, s in zip(self.variables, state)]

  def _results(self, state) -> dict:
    with keras.StatelessScope(state_mapping=self._mapping(state)):
      # Converted inside the scope: a result() that returns its variable
      # itself (the Keras guide's CategoricalTruePositives) reads `state`
      # only here; outside, it would read the live (or per-replica) one.
      values = {name: np.asarray(value)
                for name, value in self.model.get_metrics_result().items()}
    return {name: logged(value) for name, value in values.items()}

  def _touched(self, state) -> dict:
    """{name in get_metrics_result(): whether `state` holds an update of
    its metric} (a metric's state reads 0 until updated: reset_metrics)."""
    touched = {}
    with keras.StatelessScope(state_mapping=self._mapping(state)):
      for metric, places in self._places:
        result = metric.result()
        hit = not places or any(np.any(state[i]) for i in places)
        for name in result if isinstance(result, dict) else [metric.name]:
          touched[name] = hit
    return touched


def logged(value):
  """A metric's (or a model's own train_step's) value as Keras' fit logs
  it (python_utils.pythonify_logs): a float where float() takes it, else
  the numpy array (a value per class; a one-class one too, shape (1,),
  which NumPy 2's float() refuses)."""
  value = np.asarray(value)
  try:
    return float(value)
  except TypeError:
    return value


class TrainMetrics:
  """The train metrics of the log windows and of the epoch."""

  def __init__(self, state: MetricState):
    self.state = state
    self._last = None  # The state at the last window's end.
    self._read = (None, None)  # (step, state) of the latest read.
    self._epoch_from = 0  # The step before the epoch's first.
    self._resumed = None  # (state, last) a resume sets as its epoch starts.

  def start_epoch(self, epoch_from: int) -> None:
    """Resets the model's metrics, as `fit` does when an epoch begins
    after step `epoch_from`; in a run resumed mid-epoch, sets them to the
    checkpoint's instead (resume())."""
    self._epoch_from = epoch_from
    resumed, self._resumed = self._resumed, None
    self._set(*(resumed or (None, None)))

  def resume(self, kept, arrays: dict, step: int, epoch_from: int) -> str:
    """At a resume after `step`, in the epoch after `epoch_from`: the
    epoch's metrics of the checkpoint's record (`kept`: kept() then, None
    when it keeps none) for start_epoch to set; the line that says why
    they cannot be ('' when they are, or the epoch starts there)."""
    if step == epoch_from:
      return ""
    self._resumed, why = self._kept(kept, arrays, epoch_from)
    return (f"the resumed epoch's train values (its logs and History) "
            f"count only its steps after {step}: {why}" if why else "")

  def forget_window(self, record) -> None:
    """After a divergence's go-back: the epoch's metrics as the checkpoint
    gone back to (its `record`: RunRecord.restored) kept them, as its
    weights are (reset when it is of an epoch before); the next window
    starts there: the steps after it that were logged are forgotten."""
    kept, arrays = record or ({}, {})
    state = self._kept(kept.get("metrics"), arrays, self._epoch_from)[0]
    now = state[0] if state else None
    self._set(now, now)

  def kept(self, step: int, arrays: dict) -> dict:
    """The record's part for a checkpoint of `step`: the epoch's state at
    `step` and at the last window's end, as arrays named in `arrays`.
    At an epoch's end it is the state read before the eval (which resets
    the metrics): a rerun with a higher train.steps goes on with it when
    the last epoch was cut short by the train.steps before."""
    now = self._state_at(step)
    for i, (value, last) in enumerate(zip(now, self._last or now)):
      arrays[f"metrics.{i}"] = value
      if self._last is not None:
        arrays[f"metrics.{i}.last"] = last
    return {"epoch_from": self._epoch_from, "windowed": self._last is not None,
            "variables": self.state.signature()}

  def _kept(self, kept, arrays: dict, epoch_from: int) -> tuple:
    """((state, last) of `kept` or None, why it is not this epoch's)."""
    if kept is None:
      return None, ("its checkpoint, saved by an older dist_keras, keeps "
                    "none of the steps before")
    if kept["epoch_from"] != epoch_from:
      return None, (f"its checkpoint's epoch began after step "
                    f"{kept['epoch_from']} (eval.every changed)")
    if kept["variables"] != self.state.signature():
      return None, "its checkpoint's metrics are another model's"
    n = len(kept["variables"])
    return ([arrays[f"metrics.{i}"] for i in range(n)],
            [arrays[f"metrics.{i}.last"] for i in range(n)]
            if kept["windowed"] else None), ""

  def _set(self, state, last) -> None:
    """The epoch's metrics set to `state` (None: reset), the last window's
    end to `last`."""
    self.state.model.reset_metrics()
    if state is not None:
      self.state.assign(state)
    self._last, self._read = last, (None, None)

  def _state_at(self, step: int) -> list:
    """The state after `step`, read once however often it is asked for."""
    if self._read[0] != step:
      self._read = (step, self.state.read())
    return self._read[1]

  def window(self, step: int, step_logs=None) -> dict:
    """The values of the steps since the last window, up to `step` (with
    a model's own step's `step_logs`: results()); a window that a
    divergence emptied has nothing measured: {}, or `step_logs`."""
    now = self._state_at(step)
    last = self._last or [np.zeros_like(s) for s in now]
    self._last = now
    window = [n - b for n, b in zip(now, last)]
    if not any(np.any(w) for w in window):
      return dict(step_logs or {})
    return self.state.results(window, step_logs)

  def epoch(self, step: int, step_logs=None) -> dict:
    """The values since the epoch began, up to `step`: `fit`'s epoch logs
    (and its batch logs: the epoch's running values)."""
    return self.state.results(self._state_at(step), step_logs)


def update_loss_tracker(model, x, loss) -> None:
  """Keras' loss tracker ("loss" in the model's metrics), fed as Keras'
  train_step and test_step feed it: each replica's unscaled loss weighed
  by its examples, so the read is the job's mean loss."""
  tracker = next((m for m in model.metrics if m.name == "loss"), None)
  if tracker is not None:
    examples = tf.shape(tf.nest.flatten(x)[0])[0]
    tracker.update_state(unscaled_loss(loss),
                         sample_weight=examples)


def unscaled_loss(loss):
  """A replica's loss without Keras' 1 / replicas distribution scaling (as
  Keras' own train_step feeds its loss tracker)."""
  replicas = tf.distribute.get_strategy().num_replicas_in_sync
  return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss
