"""The eval pass under train.jit_compile=true: each replica's test_step is
one XLA computation, as Keras' fit(jit_compile=True) compiles evaluate's
(training/evaluation.py); its values are the eval's without XLA at one
device and 2 replicas, partial last batches included; a test_step XLA
cannot compile is refused at the start in one line, not found after the
training steps.

In-process runs: OneDeviceStrategy('/cpu:0') and the 2-CPU `mirrored`.
"""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras.contract import xla_limits
from dist_keras.training import evaluation, metrics

STEPS = 6
CONFIG = parity_task.short_run(STEPS)
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")


class PyEval(keras.Model):
  """Its own test_step reads a value from Python (tf.numpy_function: no
  XLA kernel); its train_step is Keras'."""

  def test_step(self, data):
    logs = super().test_step(data)
    scale = tf.numpy_function(lambda: np.float32(1.0), [], tf.float32)
    return {**logs, "scaled": logs["loss"] * tf.reshape(scale, [])}


def _py_eval():
  inputs = keras.Input((parity_task.FEATURES,))
  model = PyEval(inputs, keras.layers.Dense(1)(inputs))
  model.compile(optimizer="sgd", loss="mse")
  return model


def _refusal_of_py_eval(workdir) -> str:
  """The one line (exit 2) a run of _py_eval under XLA stops with."""
  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(_py_eval, parity_task.dataset_fn, workdir=str(workdir),
                   strategy=ONE_CPU,
                   config={**CONFIG, "train.jit_compile": True})
  line = str(e.value)
  assert "\n" not in line and e.value.exit_code == 2, line
  return line


def test_an_eval_xla_cannot_compile_is_refused_at_the_start(tmp_path):
  """fit(jit_compile=True) fails such a test_step at its first validation;
  it ran here without XLA, and on a TPU (which compiles every step) it
  would fail after the training steps. Now: one line before step 1 naming
  the op and the fix, exit 2, nothing kept; without XLA it trains and
  evaluates as before."""
  line = _refusal_of_py_eval(tmp_path / "run")
  assert re.match(
      r"^train.jit_compile=true compiles the eval step with XLA \(as Keras' "
      r"fit\(jit_compile=True\) compiles evaluate's test_step\), and XLA has "
      r"no kernel for op\(s\) PyFunc \(at node \S*PyFunc\S*: ", line), line
  assert line.endswith("; run the Python function in dataset_fn (ds.map) "
                       "instead, or set train.jit_compile=false."), line
  assert not (tmp_path / "run").exists()
  result = dist_keras.fit(_py_eval, parity_task.dataset_fn,
                          workdir=str(tmp_path / "plain"), strategy=ONE_CPU,
                          config=CONFIG)
  assert result.summary["steps"] == STEPS
  assert result.history["val_scaled"] == result.history["val_loss"]


def test_the_runs_eval_is_compiled(tmp_path, monkeypatch):
  """The run's own eval is XLA-compiled: with the start's check skipped,
  the op XLA has no kernel for stops the first eval, said in one line as
  the eval's (a run's translation of XLA's error), exit 2."""
  monkeypatch.setattr(evaluation, "check_compiles", lambda *args: None,
                      raising=False)
  line = _refusal_of_py_eval(tmp_path / "run")
  assert line.startswith(
      "train.jit_compile=true compiles the eval step with XLA (as Keras' "
      "fit(jit_compile=True) compiles evaluate's test_step), and XLA has no"
      " kernel for op(s) PyFunc"), line


def _evaluated(strategy, model, dataset_fn, jit) -> dict:
  """One eval pass of `dataset_fn`'s eval split over `model`, made with
  or without XLA, as the run reports it (evaluation.evaluate)."""
  with strategy.scope():
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: dataset_fn("eval", ctx))
  return evaluation.evaluate(evaluation.make_eval_pass(strategy, model, jit),
                             metrics.MetricState(model), dataset)


def test_the_eval_pass_is_compiled_under_jit_compile():
  """Proof that the pass runs the test_step through XLA: an op XLA has no
  kernel for fails it there, named as the eval's (the error a run
  translates), where the pass without XLA runs it (200 examples: a
  partial last batch)."""
  model = _py_eval()
  x = tf.zeros([2, parity_task.FEATURES])  # Its metrics' state, built.
  model.compute_metrics(x, tf.zeros([2, 1]), model(x), None)
  plain = _evaluated(ONE_CPU, model, parity_task.dataset_fn, False)
  assert plain["examples"] == parity_task.SIZES["eval"]
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    _evaluated(ONE_CPU, model, parity_task.dataset_fn, True)
  bad = xla_limits.unsupported_ops(e.value, on_tpu=False)
  assert bad is not None and str(bad).startswith(
      "train.jit_compile=true compiles the eval step with XLA"), str(bad)


# Two outputs at 2 replicas (per-output losses re-weighed on the partial
# batch) compiles the longest: in the slow set.
@pytest.mark.parametrize("model_fn,replicas", [
    (parity_task.plain, 1), (parity_task.two_output, 1),
    (parity_task.custom_test_step, 1), (parity_task.plain, 2),
    (parity_task.custom_test_step, 2),
    pytest.param(parity_task.two_output, 2, marks=pytest.mark.slow)])
def test_compiled_eval_values_equal_the_plain_evals(tmp_path, mirrored,
                                                   model_fn, replicas):
  """The same trained weights evaluated with and without XLA: every value
  within float tolerance (loss, per-output losses, metrics, an own
  test_step's logs), every example counted once (200: a partial last
  batch), at 1 device and 2 replicas; the run's own final eval
  (train.jit_compile=true) reports the same, and so does Keras'
  evaluate(jit_compile=True) on one device (but per-output losses, which
  Keras weighs by a batch's static size: docs/correctness.md). The XLA
  side is the run's own final eval, the pass make_eval_pass compiles
  (test_the_runs_eval_is_compiled): a second pass compiled here, the same
  weights and code, cost a second XLA compile for nothing."""
  strategy = ONE_CPU if replicas == 1 else mirrored
  dataset_fn = (parity_task.two_output_dataset_fn
                if model_fn is parity_task.two_output
                else parity_task.dataset_fn)
  result = dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path),
                          strategy=strategy,
                          config={**CONFIG, "train.jit_compile": True})
  logged = {k[len("val_"):]: v[-1] for k, v in result.history.items()
            if k.startswith("val_")}
  assert result.summary["eval_examples"] == parity_task.SIZES["eval"]
  plain = _evaluated(strategy, result.model, dataset_fn, False)
  assert plain.pop("examples") == parity_task.SIZES["eval"]
  for key in ("steps", "seconds", "traced"):
    plain.pop(key)
  assert plain.keys() == logged.keys()
  for name, value in plain.items():
    np.testing.assert_allclose(logged[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)
  if replicas == 1 and model_fn is not parity_task.two_output:
    model = result.model
    model.jit_compile = True
    fits = model.evaluate(dataset_fn("eval", tf.distribute.InputContext()),
                          verbose=0, return_dict=True)
    assert fits.keys() == logged.keys()
    for name, value in fits.items():
      np.testing.assert_allclose(logged[name], value, rtol=1e-5,
                                 atol=1e-6, err_msg=name)
