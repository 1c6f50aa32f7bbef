"""The built model checked against the run, in one order, each check called
once from here; api.build calls the two halves, before and after it makes
the input pipelines.

1. as_compiled: what the model was compiled with (compiled.py), what XLA
   cannot compile of it (contract/xla_limits.py), the lines of its own
   train_step and test_step (step_losses.py).
2. against_batches: a stateful RNN's batch size (contract/checks.py); the
   model meets its batches once (contract/probe.py); what Keras' test_step
   cannot trace (contract/traced_limits.py); then what the training reads
   from that meeting: the variables its training call assigns
   (state_updates.py), its own losses that sum over the batch
   (own_losses.py), compiled losses of one mean per batch
   (batch_losses.py), gathered slices whose count changes: one step per
   call (varying_slices.py), random draws whose state no checkpoint keeps
   in its train_step, compute_loss or training call (random_ops.py);
   under train.jit_compile, an eval step XLA cannot compile
   (evaluation.py).

Each half walks the model's layers once and hands the list to each check
that reads them; against_batches walks them again once the model has met
its batches, which builds what a subclassed model creates in build().
Every refusal is a UserError of one line, before anything is written.
"""
import tensorflow as tf

from dist_keras import installation
from dist_keras.contract import checks, probe, traced_limits, xla_limits
from dist_keras.training import batch_losses, call_losses, compiled
from dist_keras.training import evaluation, own_losses, random_ops
from dist_keras.training import state_updates, step_losses, step_optimizers
from dist_keras.training import varying_slices


# The start-up line of a dataset_fn whose eval split is None.
NO_EVAL_SPLIT = ("no eval split: dataset_fn('eval', ...) returned None, so "
                 "the run trains without evaluating, as Keras' fit without "
                 "validation_data (epochs of eval.every steps, no val_ "
                 "logs, no eval_ fields in summary.json)")


def as_compiled(model, strategy, train_cfg) -> list[str]:
  """Applies what the model was compiled with to `train_cfg` (steps per
  call, XLA: compiled.take) and checks it; returns the lines the run says
  before its first step.

  Raises:
    UserError: run_eagerly=True, a steps_per_execution that contradicts
      train.steps_per_loop, a layer XLA cannot compile where the step is
      compiled (train.jit_compile=true, a TPU), or XLA over a multi-device
      step the model writes itself.
  """
  layers = installation.layers_in(model, include_self=False)
  notes = compiled.take(model, layers, strategy, train_cfg)
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  xla_limits.check_layers(model, layers, train_cfg.jit_compile, on_tpu)
  xla_limits.check_own_step(model, strategy, train_cfg.jit_compile)
  notes += step_losses.own_steps_notes(model, strategy.num_replicas_in_sync)
  return [note for note in notes if note]


def against_batches(step: step_optimizers.StepTrace, dataset_fn, eval_spec,
                    train_cfg) -> tuple[bool, list]:
  """(whether the eval has a loss, the lines to say): `step.model` against
  the batches of both splits (`step.batch_spec` and `eval_spec`: the train
  and eval element specs of `dataset_fn`'s pipelines, per replica; the
  eval's None: no eval split), met once (its loss and metrics' state built
  from them); what it made of them read by the checks that follow.
  A stateful RNN built for another batch than a replica's is refused
  before the model meets them.

  Raises:
    UserError: any of the checks' refusals, and an eval step XLA cannot
      compile under train.jit_compile.
  """
  model, strategy, batch_spec = step.model, step.strategy, step.batch_spec
  replicas = strategy.num_replicas_in_sync
  layers = installation.layers_in(model, include_self=False)
  checks.stateful_batches(model, layers, replicas,
                          train_cfg.global_batch_size)
  met = probe.meet(model, layers, strategy, batch_spec, eval_spec,
                   getattr(dataset_fn, "builtin_data", None))
  # No eval split (eval_spec None): nothing of the eval is checked.
  evaluates = met.evaluates and eval_spec is not None
  if evaluates and not checks.overrides(model, "test_step"):
    traced_limits.check_eval(model)  # (Keras' train_step's: call_model_fn.)
  layers = installation.layers_in(model, include_self=False)  # Now built.
  forward = state_updates.traced(model, layers, strategy, batch_spec)
  updates = state_updates.check(model, layers, forward, replicas)
  own_losses.check(model, strategy, batch_spec, forward)
  if evaluates:
    evaluation.check_compiles(strategy, model, eval_spec,
                              train_cfg.jit_compile)
  return evaluates, [
      met.no_eval if eval_spec is not None else NO_EVAL_SPLIT,
      updates, call_losses.own_step_note(model, replicas, forward),
      batch_losses.divide_means(model, strategy, met),
      varying_slices.one_step_per_call(model, strategy, met, train_cfg),
      random_ops.note(step, layers, forward)]
