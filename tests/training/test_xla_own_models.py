"""Users' own models under XLA (train.jit_compile=true) and on a TPU: what
trains as Keras' fit(jit_compile=True) trains it, and what cannot is
refused or explained in one line.

In-process runs use OneDeviceStrategy('/cpu:0') (one device: where XLA
compiles a model's own train_step, update included).
"""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dist_keras
import parity_task
from dist_keras import installation
from dist_keras.contract import xla_limits

STEPS = 6
CONFIG = parity_task.short_run(STEPS)
ONE_CPU = tf.distribute.OneDeviceStrategy("/cpu:0")


def _fit_weights(model_fn, jit_compile: bool):
  """Keras' fit on STEPS batches of parity_task's train split."""
  keras.utils.set_random_seed(0)
  model = model_fn()
  model.jit_compile = jit_compile
  model.fit(parity_task.dataset_fn("train", tf.distribute.InputContext()),
            steps_per_epoch=STEPS, epochs=1, verbose=0, shuffle=False)
  return [w.numpy() for w in model.weights]


def test_own_train_step_compiles_as_fit_compiles_it(tmp_path):
  """A model's own train_step with train.jit_compile=true on one device,
  the breakdown's timed steps on (log.sync_timing's default): it trains,
  to fit(jit_compile=True)'s weights on the same batches. The step is
  XLA-compiled as fit compiles it (an op with no XLA kernel would fail);
  the timing stamps stay outside XLA."""
  want = _fit_weights(parity_task.custom_step, jit_compile=True)
  result = dist_keras.fit(
      parity_task.custom_step, parity_task.dataset_fn,
      workdir=str(tmp_path), strategy=ONE_CPU,
      config={**CONFIG, "train.jit_compile": True})
  assert result.summary["steps"] == STEPS
  assert result.summary["chosen"]["xla"] == "train_step"
  got = [w.numpy() for w in result.model.weights]
  assert len(got) == len(want)
  for ours, fits in zip(got, want):
    np.testing.assert_allclose(ours, fits, atol=1e-6)


class PyScale(keras.layers.Layer):
  """Scales by a factor computed in Python (tf.py_function: no XLA
  kernel)."""

  def call(self, x):  # pylint: disable=arguments-differ
    scale = tf.py_function(lambda: tf.constant(0.5), [], tf.float32)
    return x * tf.reshape(scale, [])


class PyStep(keras.Model):
  """Keras' guide's own train_step, its loss scaled by a tf.py_function."""

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = self.compute_loss(y=y, y_pred=self(x, training=True))
      loss *= tf.reshape(tf.py_function(lambda: tf.constant(1.0), [],
                                        tf.float32), [])
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"loss": loss}


def _py_layer_model():
  inputs = keras.Input((parity_task.FEATURES,))
  model = keras.Model(inputs, keras.layers.Dense(1)(
      PyScale(name="py_scale")(inputs)))
  model.compile(optimizer="sgd", loss="mse")
  return model


def _py_step_model():
  inputs = keras.Input((parity_task.FEATURES,))
  model = PyStep(inputs, keras.layers.Dense(1)(inputs))
  model.compile(optimizer="sgd", loss="mse")
  return model


# A layer's op is met first by the eval's compile, tried at the start
# (tests/training/test_eval_xla.py); the others at step 1.
_EVAL = (r"the eval step with XLA \(as Keras' fit\(jit_compile=True\) "
         r"compiles evaluate's test_step\)")


@pytest.mark.parametrize("model_fn,dataset_fn,op,node,fix,step", [
    (_py_layer_model, parity_task.dataset_fn, "EagerPyFunc", "py_scale",
     r"run the Python function in dataset_fn \(ds.map\) instead", _EVAL),
    # The own train_step is XLA-compiled too, as fit(jit_compile=True)
    # compiles it.
    (_py_step_model, parity_task.dataset_fn, "EagerPyFunc", "EagerPyFunc",
     r"run the Python function in dataset_fn \(ds.map\) instead",
     "the train step with XLA"),
    (parity_task.sparse_adam, parity_task.bags_dataset_fn,
     "SparseFillEmptyRows", "dense", r"densify the sparse input in "
     r"dataset_fn \(tf.sparse.to_dense\)", "the train step with XLA")])
def test_an_op_xla_cannot_compile_is_named_in_one_line(
    tmp_path, model_fn, dataset_fn, op, node, fix, step):
  """What no Keras flag marks (tf.py_function, a sparse input's ops) fails
  under XLA, as under fit(jit_compile=True): in a layer before step 1 (the
  eval's compile, tried at the start, meets it), else at step 1; one line
  naming the op, its node (the layer's path) and the fix, exit 2, nothing
  kept."""
  with pytest.raises(dist_keras.UserError) as e:
    dist_keras.fit(model_fn, dataset_fn, workdir=str(tmp_path / "run"),
                   strategy=ONE_CPU, config={**CONFIG,
                                             "train.jit_compile": True})
  line = str(e.value)
  assert "\n" not in line and e.value.exit_code == 2, line
  assert re.match(
      rf"^train.jit_compile=true compiles {step}, and XLA has no kernel "
      rf"for op\(s\) {op} \(at node \S*{node}\S*: ", line), line
  assert re.search(rf"; {fix}, or set train.jit_compile=false\.$", line), line
  assert not (tmp_path / "run").exists()


def _strings_model():
  """A StringLookup inside the model (Keras: supports_jit=False)."""
  words = ["red", "green", "blue"]
  inputs = keras.Input((), dtype="string")
  ids = keras.layers.StringLookup(vocabulary=words, name="words")(inputs)
  hidden = keras.layers.Embedding(len(words) + 1, 4)(ids)
  model = keras.Model(inputs, keras.layers.Dense(1)(hidden), name="colours")
  model.compile(optimizer="sgd", loss="mse")
  return model


def _strings_dataset_fn(split, input_context):
  del split
  words = tf.constant(["red", "green", "blue", "cyan"] * 12)
  ds = tf.data.Dataset.from_tensor_slices((words, tf.ones([48, 1])))
  return ds.repeat().batch(
      input_context.get_per_replica_batch_size(parity_task.GLOBAL_BATCH),
      drop_remainder=True).take(4)


def test_a_layer_keras_marks_unjittable_is_refused_at_start(tmp_path):
  """A StringLookup with train.jit_compile=true: refused before step 1 in
  one line naming the layer, its class, why and the fix (a raw XLA error
  of ~30 lines at step 1 before); nothing is kept."""
  with pytest.raises(dist_keras.UserError, match=(
      r"^train.jit_compile=true compiles the train step with XLA, and layer "
      r"'words' \(StringLookup\) of model 'colours' cannot be compiled by "
      r"XLA \(Keras marks it supports_jit=False\); apply it in dataset_fn "
      r"\(ds.map\(layer\)\) before the model, or set "
      r"train.jit_compile=false\.$")):
    dist_keras.fit(_strings_model, _strings_dataset_fn,
                   workdir=str(tmp_path / "run"), strategy=ONE_CPU,
                   config={**CONFIG, "train.jit_compile": True})
  assert not (tmp_path / "run").exists()


def _inside(model) -> list:
  """The layers inside `model`, as the run hands them to the checks."""
  return installation.layers_in(model, include_self=False)


def test_unjittable_layers_are_refused_on_a_tpu_whatever_jit_compile_says():
  """A TPU compiles every step: its fix cannot be train.jit_compile=false.
  A flagged layer's own sublayers (TextVectorization's StringLookup) are
  not named apart; without XLA nothing is refused."""
  model = _strings_model()
  xla_limits.check_layers(model, _inside(model), jit_compile=False,
                          on_tpu=False)
  with pytest.raises(dist_keras.UserError, match=(
      r"^a TPUStrategy compiles every step with XLA, and layer 'words' "
      r"\(StringLookup\) .*; apply it in dataset_fn \(ds.map\(layer\)\) "
      r"before the model\.$")):
    xla_limits.check_layers(model, _inside(model), jit_compile=False,
                            on_tpu=True)
  vectorize = keras.layers.TextVectorization(max_tokens=8, name="text")
  vectorize.adapt(tf.constant(["red green", "blue"]))
  inputs = keras.Input((), dtype="string")
  model = keras.Model(inputs, keras.layers.Embedding(8, 2)(vectorize(inputs)))
  with pytest.raises(dist_keras.UserError, match=(
      r"layer 'text' \(TextVectorization\) of model")):
    xla_limits.check_layers(model, _inside(model), jit_compile=True,
                            on_tpu=False)


def test_sparse_and_ragged_batches_are_refused_on_a_tpu():
  """TPUStrategy takes dense batches only (TF's own ValueError asks for an
  InputOptions dist_keras' user cannot pass): one line naming the part."""
  sparse = tf.SparseTensorSpec([8, 12], tf.float32)
  ragged = tf.RaggedTensorSpec([8, None], tf.int32)
  dense = tf.TensorSpec([8], tf.int32)
  for spec in ((sparse, dense), (dense, ragged), ({"ids": ragged}, dense)):
    xla_limits.check_tpu_batches(spec, "train", on_tpu=False)
  with pytest.raises(dist_keras.UserError, match=(
      r"^dataset_fn\('train', ...\) gives a sparse batch part \(x: "
      r"SparseTensorSpec\) under a TPUStrategy, which takes dense batches "
      r"only; pad or densify it in dataset_fn")):
    xla_limits.check_tpu_batches((sparse, dense), "train", on_tpu=True)
  with pytest.raises(dist_keras.UserError, match=r"a ragged batch part \(y:"):
    xla_limits.check_tpu_batches((dense, ragged), "train", on_tpu=True)
  with pytest.raises(dist_keras.UserError, match=r"\(x/ids: RaggedTensorSpec"):
    xla_limits.check_tpu_batches(({"ids": ragged}, dense), "eval", True)
  xla_limits.check_tpu_batches((dense, dense), "train", on_tpu=True)


def test_a_pipeline_per_replica_is_refused_on_a_tpu():
  xla_limits.check_tpu_pipelines(True, on_tpu=False)
  xla_limits.check_tpu_pipelines(False, on_tpu=True)
  with pytest.raises(dist_keras.UserError, match=(
      r"^data.pipeline_per_replica=true under a TPUStrategy: .*; set "
      r"data.pipeline_per_replica=false\.$")):
    xla_limits.check_tpu_pipelines(True, on_tpu=True)
