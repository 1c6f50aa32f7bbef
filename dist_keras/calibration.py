"""After training: what the step would cost with free communication, and
whether the measured all-reduce matches the alpha-beta model.

Both run on the chief's strategy after the last train step, so they never
slow training itself; `log.calibration_steps=0` skips them.
"""
import math
import statistics
import time

import tensorflow as tf

from dist_keras import costmodel
from dist_keras import step as step_lib
from dist_keras import sync

_MIN_SWEEP_BYTES = 1 << 18


def no_communication_step_ms(strategy, model, optimizer, iterator,
                             steps: int) -> float:
  """Median wall time of a step with the same forward and backward pass but
  no all-reduce and no update: the ideal-communication step."""

  def replica_step(batch):
    _, grads = step_lib.forward_backward(model, optimizer, batch,
                                         update_metrics=False)
    grads = sync.dense_gradients(grads)  # As the train step does.
    # Consume every gradient so none is pruned; per replica, no collective.
    return tf.add_n([tf.reduce_sum(g) for g in grads if g is not None])

  @tf.function
  def step(it):
    return strategy.experimental_local_results(
        strategy.run(replica_step, args=(next(it),)))

  step(iterator)  # Trace and warm up.
  samples = []
  for _ in range(steps):
    start = time.perf_counter()
    [t.numpy() for t in step(iterator)]  # pylint: disable=expression-not-assigned
    samples.append(time.perf_counter() - start)
  return 1e3 * statistics.median(samples)


def allreduce_model_check(strategy, gradient_bytes: int,
                          measured_allreduce_ms,
                          deterministic: bool = False) -> dict:
  """Fits the ring model on this strategy; predicts the gradients' all-reduce.

  Messages up to 4x the gradient size are measured (enough to bracket it,
  and quick). Returns alpha, bandwidth, the prediction and its ratio to the
  measured in-graph `sync/allreduce_ms` mean. `deterministic` (multi-worker)
  runs every repeat: a time budget could stop workers after different
  numbers of collectives, and the one that runs more would hang.
  """
  n = strategy.num_replicas_in_sync
  if n == 1:
    return {"allreduce_predicted_ms": 0.0}
  try:
    # At least 256 KiB (5 sizes): with only 1-64 KiB every point is latency,
    # and noise on a busy host tilted the line the wrong way (a negative
    # slope). Not much more: bandwidth per byte grows with message size on
    # a CPU, so far larger messages make small gradients look cheaper.
    fit = costmodel.calibrate(strategy, max_bytes=max(4 * gradient_bytes,
                                                      _MIN_SWEEP_BYTES),
                              repeats=10,
                              budget_s=math.inf if deterministic else 0.5)
  except ValueError as e:  # A bad fit must not cost the finished run.
    return {"allreduce_predicted_ms": None, "allreduce_fit_error": str(e)}
  predicted = 1e3 * costmodel.allreduce_seconds(
      n, gradient_bytes, fit["alpha_s"], fit["bandwidth_Bps"])
  return {"allreduce_alpha_us": 1e6 * fit["alpha_s"],
          "allreduce_bandwidth_GBps": fit["bandwidth_Bps"] / 1e9,
          "allreduce_predicted_ms": predicted,
          "allreduce_measured_over_predicted": (
              measured_allreduce_ms / predicted
              if measured_allreduce_ms and predicted else None)}
