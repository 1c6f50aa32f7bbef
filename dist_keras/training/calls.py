"""The calls the loop makes: one timed step, or up to n plain steps in one
tf.function call (an in-graph loop), of dist_keras' step for a compiled
model (steps.py) or of the model's own train_step (model_step.py). Where
both compile alike, one function runs both: a timed call is a call of one
step whose stamps are read.

One call per n steps instead of per step: host round trips dominate on TPUs
(and cost ~1 ms of dispatch per step here). A call stops early after a step
whose loss (or gradients, or a model's own logs) is not finite, so the
host sees that step before anything is saved. The loops are explicit
tf.while_loops, not AutoGraph: a conversion that fails (the source
unreadable, or changed on disk under a running process) falls back to
Python silently.
"""
import time

import tensorflow as tf

from dist_keras.contract import batches
from dist_keras.distribute import strategies
from dist_keras.errors import UserError
from dist_keras.measure import stamps
from dist_keras.training import (keras_internals, model_step, report,
                                 steps, trained_set, watch)


class Calls:
  """`calls(iterator, timed, n) -> dict`: a timed step or n plain ones,
  run by one function where both compile alike (one_function), else by
  two (a model's own train_step, or XLA compiling a plain step whole)."""

  def __init__(self, strategy, model, options: steps.StepOptions,
               own_step: bool, call_watch: watch.CallWatch, host_figures):
    self.watch = call_watch  # Lines while a call runs long.
    # Read as a timed call starts (meters.RunMeters.host_figures); None
    # for a run without timed calls (log.sync_timing off).
    self.host_figures = host_figures
    # The variables each trace of dist_keras' step updates (trained_set).
    self.traced, self.said_changed = [], False
    # What a plain call of the one function drops: its last step's stamps.
    self.stamped = ()
    self.gather_rows = keras_internals.made_per_run(
        stamps.rows_gatherer(strategy))
    if own_step:
      jit = options.jit is not steps.Jit.OFF
      # The timed trace's logs (a run's first call is timed): the plain
      # loop starts from them, not from a step traced outside it.
      logs_specs = []
      self.timed = model_step.make_train_step(strategy, model, True, jit,
                                              logs_specs)
      self.plain = _own_steps(model_step.make_train_step(
          strategy, model, jit=jit).python_function, logs_specs)
    elif host_figures and not steps.compiles_whole(strategy, options.jit):
      # The plain steps compile as the timed one does: one function runs
      # both, a timed call being a call of one step. A second function
      # cost a second trace and compile (a 48-block MLP: 18.9 s of a 50 s
      # run), and its stamps cost nothing measurable (docs/sync_breakdown.md).
      start = _stamps_start(strategy)
      self.stamped = tuple(start)
      self.plain = self.timed = _compiled_steps(steps.make_train_step(
          strategy, model, options, True, self.traced).python_function,
          start)
    else:
      self.timed = steps.make_train_step(strategy, model, options, True,
                                         self.traced)
      self.plain = _compiled_steps(steps.make_train_step(
          strategy, model, options, traced=self.traced).python_function)
    # A resumed process warms its timed function up with its first step,
    # as a run does with step 1, where a timed step updates the weights
    # as a plain one does (a resume is bitwise exact): not on one device
    # under jit_compile, where the plain step compiles the update too.
    self.warms_up = own_step or not (options.jit is steps.Jit.COMPUTE
                                     and steps.update_compiles(strategy))

  @property
  def one_function(self) -> bool:
    """Whether one function runs the timed and the plain calls."""
    return self.timed is self.plain

  def first_timed(self, resumed_at: int) -> int:
    """The process's first step to run the timed function, whose trace
    and first run leave no breakdown (Schedule.timed)."""
    return resumed_at + 1 if self.warms_up else 1

  def trainable_changed(self, model) -> str | None:
    """The line, once, for a model whose trainable variables are no
    longer those its traced steps update (at an epoch boundary)."""
    line = None if self.said_changed else trained_set.changed_line(
        model, self.traced)
    self.said_changed = self.said_changed or line is not None
    return line

  def __call__(self, iterator, timed: bool, n: int) -> dict:
    """The call's results; with 'traced' ("one", "timed" or "plain") when it
    traced and compiled that function (its first call: seconds to
    minutes for a large model, which the loop reports)."""
    function = self.timed if timed else self.plain
    traces = function.experimental_get_tracing_count()
    host = tf.constant(self.host_figures() if timed else (0.0, 0.0),
                       tf.float64)
    arguments = ((tf.constant(n), host) if self.one_function else
                 (host,) if timed else (tf.constant(n),))
    started = time.perf_counter()
    kind = "one" if self.one_function else "timed" if timed else "plain"
    name = report.FUNCTIONS[kind][0]
    with self.watch.call(f"tracing and compiling the {name}"
                         if not traces else
                         f"running a call of {n} step{'s' * (n > 1)}"):
      out = function(iterator, *arguments)
    if not timed:  # A plain call's last stamps: no breakdown is read.
      out = {k: v for k, v in out.items() if k not in self.stamped}
    elif "job_rows" in out:  # Every worker's, for the chief.
      out["job_durations"] = self.gather_rows(out.pop("job_rows"))
    if function.experimental_get_tracing_count() > traces:
      out["traced"] = kind
    out["started"] = started  # The call's time (meters.RunMeters.ran).
    return out


def of_trainer(trainer) -> Calls:
  """The calls of a loop.Trainer's run, its meters started."""
  options = trainer.settings.step_options
  return Calls(trainer.strategy, trainer.model, steps.StepOptions(
      jit=steps.Jit.of(options["jit_compile"]),
      allreduce_dtype=options["allreduce_dtype"],
      bytes_per_pack=options["bytes_per_pack"]), trainer.custom_step,
      trainer.call_watch, trainer.meters.host_figures
      if trainer.settings.schedule.sync_timing else None)


def run_dry_error(trainer, run, n: int) -> UserError:
  """The error for a train stream that ran out inside a call of the n
  steps after run.step (which one failed is not known on the host)."""
  first = run.step + 1
  if n == 1 and run.step == run.resumed_at:  # Not one batch this run.
    config = trainer.config_dict
    pipelines = (trainer.replicas if config["data"]["pipeline_per_replica"]
                 else trainer.workers)
    # A worker's one pipeline is known; of a process's several, not which.
    pipeline = (strategies.worker_id(trainer.strategy)
                if trainer.workers == pipelines else None)
    return UserError(batches.smaller_than_a_batch(
        f"dataset_fn('train', ...) ran out of batches at step {first}, the "
        "first of this run", config["train"]["global_batch_size"] //
        trainer.replicas, pipeline, pipelines))
  at = f"step {first}" if n == 1 else f"steps {first}-{first + n - 1}"
  return UserError(
      f"dataset_fn('train', ...) ran out of batches at {at}; repeat it "
      f"(ds.repeat()) so training runs train.steps={run.schedule.steps} "
      "steps.")


def _compiled_steps(one_step, stamped: dict | None = None):
  """`(iterator, n) -> dict`: up to n of dist_keras' steps; the summed
  'loss' and 'skipped', the last 'finite_grads' and 'sent_bytes', and
  'steps' run. With `stamped` (_stamps_start's zeros) the steps are timed
  ones, `(iterator, n, host) -> dict` with the last step's stamps too."""

  def train_steps(iterator, n, host=None):
    def run_one(state):
      out = one_step(iterator, host) if stamped else one_step(iterator)
      return ({"steps": state["steps"] + 1,
               "loss": state["loss"] + out["loss"],
               "finite_grads": out["finite_grads"],
               "skipped": state["skipped"] + out["skipped"],
               "sent_bytes": out["sent_bytes"], "stop": _diverged(out),
               **{k: out[k] for k in stamped or ()}},)

    def keep_going(state):
      return tf.logical_and(state["steps"] < n,
                            tf.logical_not(state["stop"]))

    start = {"steps": tf.constant(0), "loss": tf.constant(0.0),
             "finite_grads": tf.constant(True), "skipped": tf.constant(0),
             "sent_bytes": tf.zeros([2], tf.int64),
             "stop": tf.constant(False), **(stamped or {})}
    out, = tf.while_loop(keep_going, run_one, (start,))
    del out["stop"]
    return out

  return keras_internals.made_per_run(tf.function(train_steps,
                                                  autograph=False))


def _stamps_start(strategy) -> dict:
  """Zeros shaped as what a timed step returns besides a plain step's
  (steps._distributed_step; this worker's replicas'): the while loop's
  start."""
  local = stamps.local_replicas(strategy)
  zeros = lambda *shape: tf.zeros(shape, tf.float64)  # noqa: E731
  return {"step_start": zeros(), "inputs_ready": zeros(),
          "stamps": zeros(local, len(stamps.STAMPS)),
          "job_rows": zeros(local, stamps.DURATIONS)}


def _diverged(out):
  """A non-finite loss, or non-finite gradients that loss scaling did not
  skip."""
  return tf.logical_or(
      tf.logical_not(tf.math.is_finite(out["loss"])),
      tf.logical_and(tf.logical_not(out["finite_grads"]),
                     tf.equal(out["skipped"], 0)))


def _own_steps(one_step, logs_specs=()):
  """`(iterator, n) -> dict`: up to n of the model's own steps; the last
  step's 'logs' and 'finite', and 'steps' run.

  The loop needs the logs' structure before its body traces: the timed
  step's (`logs_specs`, where it traced first and its shapes are static),
  else a first step traced outside the loop, a second trace of the
  model's train_step (half the plain function's tracing and compiling:
  keras.io's WGAN 27.4 s against the timed function's 13.5 s)."""

  @tf.function(autograph=False)
  def train_steps(iterator, n):
    specs = logs_specs[-1] if logs_specs else None
    if specs is not None and all(s.shape.is_fully_defined()
                                 for s in tf.nest.flatten(specs)):
      start = (tf.constant(0), tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), specs), tf.constant(True))
    else:
      first = one_step(iterator)  # Its logs give the loop's structure.
      start = (tf.constant(1), first["logs"], first["finite"])

    def run_one(done, logs, finite):
      del logs, finite
      out = one_step(iterator)
      return done + 1, out["logs"], out["finite"]

    # At least one step (n >= 1): the zeros are never returned.
    done, logs, finite = tf.while_loop(
        lambda done, logs, finite: tf.logical_and(done < n, finite),
        run_one, start)
    return {"logs": logs, "finite": finite, "steps": done}

  return keras_internals.made_per_run(train_steps)
