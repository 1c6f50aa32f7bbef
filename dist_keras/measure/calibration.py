"""After training: what the step would cost with free communication, and
whether the measured all-reduce matches the alpha-beta model.

Both run on the chief's strategy after the last train step, so they never
slow training itself; `log.calibration_steps=0` skips them. The model is
left as training left it (model_kept).
"""
import contextlib
import math
import statistics
import time

import tensorflow as tf

from dist_keras.measure import costmodel

_MIN_SWEEP_BYTES = 1 << 18
# allreduce_model_check's fields for more than one replica.
_MODEL_FIELDS = ("allreduce_alpha_us", "allreduce_bandwidth_GBps",
                 "allreduce_predicted_ms", "allreduce_measured_over_predicted")


def call_plan(steps: int, per_call: int) -> tuple[int, int]:
  """(steps per call, timed calls) of no_communication_step_ms: calls of
  the run's largest call, at least 3, `steps` steps in all when that is
  more; one more call before them traces and warms up."""
  per_call = max(1, min(per_call, steps))
  return per_call, max(3, steps // per_call)


def no_communication_step_ms(strategy, replica_compute, iterator,
                             steps: int, per_call: int = 1) -> float:
  """Median wall time per step of `replica_compute(batch)` (the train step's
  forward and backward pass, step.make_compute_only) on every replica, with
  no all-reduce and no update: the ideal-communication step.

  Timed in calls of `per_call` steps (an in-graph loop), the largest call
  the run made, so it compares with the run's own step time: steps in one
  call overlap, which one step a call cannot show (docs/performance.md).
  At least 3 calls, `steps` steps in all when that is more.
  """
  per_call, timed_calls = call_plan(steps, per_call)

  @tf.function(autograph=False)
  def calls(it, n):
    def body(done, total):
      local = strategy.experimental_local_results(
          strategy.run(replica_compute, args=(next(it),)))
      # Each replica's scalar, added on this host: a copy, not a collective.
      return done + 1, total + tf.add_n(
          [tf.cast(t, tf.float32) for t in local])

    return tf.while_loop(lambda done, _: done < n, body,
                         (tf.constant(0), tf.constant(0.0)))[1]

  n = tf.constant(per_call)
  calls(iterator, n)  # Trace and warm up.
  samples = []
  for _ in range(timed_calls):
    start = time.perf_counter()
    calls(iterator, n).numpy()
    samples.append((time.perf_counter() - start) / per_call)
  return 1e3 * statistics.median(samples)


@contextlib.contextmanager
def model_kept(strategy, model, also=()):
  """Puts back, as it ends, every variable of `model` that a forward and
  backward pass in training mode writes without an update: the moving
  statistics (BatchNormalization), the seeds (Dropout), the metrics and
  loss trackers (compute_loss feeds one per output of a model of several
  losses). The calibration's passes run in training mode, and the model
  returned and saved must be the one training left. Each replica's copy
  gets its own value back: a BatchNormalization's statistics (aggregation
  "none") differ between replicas; each worker puts back its own. The
  trainable variables are not copied: nothing updates them. `also`: other
  variables the passes write (a stateful RNN's states, which Keras keeps
  out of the model's variables)."""
  variables = {id(v): v for v in [*model.non_trainable_variables,
                                   *model.metrics_variables, *also]}
  kept = [(copy, copy.read_value()) for v in variables.values()
          for copy in strategy.experimental_local_results(v.value)]
  try:
    yield
  finally:
    for copy, value in kept:
      copy.assign(value)


def check(strategy, call_step_ms: float, ideal_step_ms: float,
          traffic: costmodel.Traffic, measured_allreduce_ms,
          deterministic: bool) -> dict:
  """summary.json's calibration fields: the run's step in its calls
  (timing.CallTimes), the ideal speedup and the all-reduce model's
  prediction (allreduce_model_check)."""
  return {"call_step_ms": call_step_ms, "ideal_step_ms": ideal_step_ms,
          "ideal_speedup": call_step_ms / ideal_step_ms,
          **allreduce_model_check(strategy, traffic,
                                  measured_allreduce_ms, deterministic)}


def not_measured(replicas: int) -> dict:
  """check()'s fields for a run whose calibration did not run where it
  would have (a rerun that finishes a run stopped after its last
  checkpoint): None, but one replica's all-reduce, which is known to cost
  nothing."""
  fields = ("call_step_ms", "ideal_step_ms", "ideal_speedup")
  if replicas == 1:
    return {**dict.fromkeys(fields), "allreduce_predicted_ms": 0.0}
  return dict.fromkeys(fields + _MODEL_FIELDS)


def lines(out: dict, traffic: costmodel.Traffic, measured_allreduce_ms,
          multi_replica: bool) -> list[str]:
  """What a run prints of its calibration (`out`: check's result)."""
  ideal = ("with free communication (no all-reduce, no update)"
           if multi_replica else
           "without the update (one replica: nothing to all-reduce)")
  said = [f"step {out['call_step_ms']:.1f} ms in its calls; {ideal} "
          f"{out['ideal_step_ms']:.1f} ms: ideal speedup "
          f"x{out['ideal_speedup']:.2f}"]
  if out.get("allreduce_fit_error"):
    said.append(f"all-reduce model not fitted: {out['allreduce_fit_error']}")
  elif measured_allreduce_ms is not None and multi_replica:
    said.append(
        f"{_sent(traffic)}: measured "
        f"{measured_allreduce_ms:.2f} ms, alpha-beta model "
        f"{out['allreduce_predicted_ms']:.2f} ms (alpha "
        f"{out['allreduce_alpha_us']:.0f} us, bus bandwidth "
        f"{out['allreduce_bandwidth_GBps']:.2f} GB/s)")
  return said


def _sent(traffic: costmodel.Traffic) -> str:
  said = f"all-reduce of {traffic.allreduced:,} gradient bytes"
  if traffic.gathered:
    said += f" and all-gather of {traffic.gathered:,} (embedding slices)"
  return said


def allreduce_model_check(strategy, traffic: costmodel.Traffic,
                          measured_allreduce_ms,
                          deterministic: bool = False) -> dict:
  """Fits the ring model on this strategy; predicts the gradients' sync
  (the all-reduce, and the all-gather of an Embedding's slices).

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
    fit = costmodel.calibrate(strategy, max_bytes=max(4 * max(traffic),
                                                      _MIN_SWEEP_BYTES),
                              repeats=10,
                              budget_s=math.inf if deterministic else 0.5)
  except ValueError as e:  # A bad fit must not cost the finished run.
    return {"allreduce_predicted_ms": None, "allreduce_fit_error": str(e)}
  predicted = 1e3 * costmodel.sync_seconds(
      n, traffic, fit["alpha_s"], fit["bandwidth_Bps"])
  return dict(zip(_MODEL_FIELDS, (
      1e6 * fit["alpha_s"], fit["bandwidth_Bps"] / 1e9, predicted,
      measured_allreduce_ms / predicted
      if measured_allreduce_ms and predicted else None)))
