"""Model FLOPs (measure/flops.py), peak FLOP/s (measure/mfu.py,
peak_tables.py) and MFU (measure/mfu.py); a measured peak's timings in
test_peak.py."""
import json
import os
import re

import keras
import pytest

import helpers
from dist_keras import data
from dist_keras import models, validate
from dist_keras.measure import flops
from dist_keras.measure import mfu
from dist_keras.measure import peak_tables
from dist_keras.errors import UserError


def _model(inputs, outputs):
  return keras.Model(inputs, outputs)


def test_dense_counts_two_flops_per_multiply_add():
  x = keras.Input((10,))
  hidden = keras.layers.Dense(20, activation="relu")(x)
  model = _model(x, keras.layers.Dense(5)(hidden))
  # 10x20 + 20x5 multiply-adds; bias and relu are not counted.
  assert flops.count(model).forward == 2 * (10 * 20 + 20 * 5)
  assert flops.count(model).training == 3 * 2 * (10 * 20 + 20 * 5)


def test_dense_on_a_sequence_runs_at_every_position():
  x = keras.Input((7, 10))
  model = _model(x, keras.layers.Dense(3)(x))
  assert flops.count(model).forward == 2 * 10 * 3 * 7


def test_conv2d_counts_output_positions_with_strides_and_padding():
  x = keras.Input((16, 16, 3))
  y = keras.layers.Conv2D(8, 3, padding="same")(x)  # 16x16x8 out.
  y = keras.layers.Conv2D(4, 3, strides=2, padding="valid")(y)  # 7x7x4 out.
  y = keras.layers.MaxPooling2D(1)(y)
  model = _model(x, keras.layers.Dense(2)(keras.layers.Flatten()(y)))
  same = 16 * 16 * (3 * 3 * 3) * 8  # positions x (kernel area x in) x out.
  strided = 7 * 7 * (3 * 3 * 8) * 4  # floor((16 - 3) / 2) + 1 = 7.
  dense = 7 * 7 * 4 * 2
  assert flops.count(model).forward == 2 * (same + strided + dense)


def test_depthwise_separable_and_transposed_convs():
  x = keras.Input((8, 8, 4))
  y = keras.layers.DepthwiseConv2D(3, padding="same")(x)  # 8x8x4.
  y = keras.layers.SeparableConv2D(6, 3, strides=2, padding="same")(y)  # 4x4x6.
  y = keras.layers.Conv2DTranspose(2, 3, strides=2)(y)  # From 4x4 inputs.
  model = _model(x, y)
  depthwise = 8 * 8 * 4 * 3 * 3
  separable = 4 * 4 * (4 * 3 * 3 + 4 * 6)  # Both parts at output positions.
  transposed = 4 * 4 * 3 * 3 * 6 * 2  # Each INPUT position scatters a kernel.
  assert flops.count(model).forward == 2 * (depthwise + separable + transposed)


@pytest.mark.parametrize("cell,gates", [(keras.layers.LSTM, 4),
                                        (keras.layers.GRU, 3),
                                        (keras.layers.SimpleRNN, 1)])
def test_recurrent_layers(cell, gates):
  steps, features, units = 12, 8, 16
  x = keras.Input((steps, features))
  layer = cell(units)
  model = _model(x, layer(x))
  # Per step every gate multiplies [x_t, h_{t-1}] by its weights.
  by_hand = 2 * gates * (features + units) * units * steps
  assert flops.count(model).forward == by_hand
  # The same from the weights: every kernel entry is one multiply-add/step.
  kernels = layer.cell.kernel, layer.cell.recurrent_kernel
  assert by_hand == 2 * steps * sum(int(k.shape[0] * k.shape[1])
                                    for k in kernels)


def test_bidirectional_counts_both_directions():
  x = keras.Input((5, 3))
  model = _model(x, keras.layers.Bidirectional(keras.layers.GRU(4))(x))
  assert flops.count(model).forward == 2 * (2 * 3 * (3 + 4) * 4 * 5)


def test_time_distributed_runs_its_layer_at_every_step():
  x = keras.Input((5, 3))
  model = _model(x, keras.layers.TimeDistributed(keras.layers.Dense(2))(x))
  assert flops.count(model).forward == 2 * 3 * 2 * 5


def test_nested_models_and_shared_layers_are_counted_per_call():
  inner = keras.Sequential([keras.layers.Dense(6), keras.layers.Dense(3)])
  x = keras.Input((4,))
  shared = keras.layers.Dense(4)
  model = _model(x, inner(shared(shared(x))))
  assert flops.count(model).forward == 2 * (4 * 4 + 4 * 4 + 4 * 6 + 6 * 3)
  outer_in = keras.Input((4,))
  wrapped = _model(outer_in, keras.layers.Dense(1)(model(outer_in)))
  assert flops.count(wrapped).forward == (flops.count(model).forward
                                          + 2 * 3 * 1)


class _Mystery(keras.layers.Layer):
  """A layer flops.py does not know, with weights."""

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1], 5))

  def call(self, x):
    return keras.ops.matmul(x, self.w)


class _Subclassed(keras.Model):

  def __init__(self):
    super().__init__(name="subclassed")
    self.dense = keras.layers.Dense(2)

  def call(self, x):
    return self.dense(x)


def test_a_layer_with_no_rule_is_traced_and_a_subclassed_one_listed():
  """A custom layer's call is traced (its keras.ops matmul counted); a
  subclassed model, with no batches to trace it on, is listed, not 0."""
  x = keras.Input((3,))
  y = _Mystery(name="mystery")(x)
  model = _model(x, keras.layers.Dense(2)(y))
  result = flops.count(model)
  assert (result.forward, result.uncounted) == (2 * 3 * 5 + 2 * 5 * 2, [])
  sub = _Subclassed()
  sub(keras.ops.zeros((1, 3)))
  assert flops.count(sub).uncounted == [
      "subclassed (_Subclassed): a subclassed model, with no batch to trace "
      "its call on"]


def test_a_model_with_nothing_counted_has_unknown_flops_and_mfu_not_0():
  """A subclassed model (Keras' guide's form for an own train_step): its
  layers' shapes are unknown, so its FLOPs and MFU are null, not 0."""
  sub = _Subclassed()
  sub(keras.ops.zeros((1, 3)))
  usage = mfu.Utilisation(flops.count(sub), mfu.Peak(1.0, "configured", 1,
                                                     "worker"), "float32")
  summary = usage.summary(1000.0)
  assert (summary["flops_per_example"], summary["mfu"]) == (None, None)
  assert usage.scalars(1000.0) == {"perf/model_tflops": None,
                                   "perf/mfu": None}
  assert usage.line(1000.0).startswith(
      "model FLOPs unknown (not counted: 1 call, named at the start): no "
      "FLOP/s or MFU; see the layers counted: mfu.md")


class _OwnStepOnly(keras.Model):
  """keras.io's VAE and GANs: parts, a train_step, no call."""

  def __init__(self):
    super().__init__(name="vae")
    self.encoder = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])

  def train_step(self, data):
    return {}


def test_a_model_without_a_call_is_one_short_reason_said_once():
  """keras.io's VAE: 'its output shape could not be worked out
  (NotImplementedError: Could not automatically infer the output shape /
  dtype of 'vae' ...)', ~300 characters, at the start and again at the
  end of the run."""
  counted = flops.count(_OwnStepOnly(), (keras.ops.zeros((4, 3)),))
  assert counted.uncounted == ["vae (_OwnStepOnly): no call() of its own "
                               "to count"]
  usage = mfu.Utilisation(counted, mfu.Peak(1.0, "configured", 1, "worker"),
                          "float32")
  assert "vae" not in usage.line(1000.0)


def test_unknown_sequence_length_is_listed():
  x = keras.Input((None, 4))
  result = flops.count(_model(x, keras.layers.LSTM(3)(x)))
  assert result.forward == 0 and "None" in result.uncounted[0]


def test_profiler_agrees_with_the_analytic_count_for_the_cnn():
  config = helpers.tiny_config("cnn_shapes")
  config.data.image_size, config.model.filters = 32, (16, 32, 64)
  model = models.build(config.model, data.source(config.data).spec)
  analytic = flops.count(model)
  assert not analytic.uncounted
  # The profiler also counts biases and pooling: a little more.
  assert flops.profiler_forward_flops(model) == pytest.approx(
      analytic.forward, rel=0.02)


def test_profiler_agrees_with_the_analytic_count_for_resnet50():
  model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3),
                                      classes=10, classifier_activation=None)
  analytic = flops.count(model)
  assert not analytic.uncounted
  # The profiler adds batch-norm arithmetic and residual adds (~0.6%).
  assert flops.profiler_forward_flops(model) == pytest.approx(
      analytic.forward, rel=0.02)


@pytest.mark.parametrize("cell", [keras.layers.LSTM, keras.layers.GRU])
def test_profiler_agrees_for_an_unrolled_rnn(cell):
  # Unrolled, the recurrence is loop-free: the profiler sees every step.
  x = keras.Input((6, 32))
  model = _model(x, cell(64, unroll=True)(x))
  assert flops.profiler_forward_flops(model) == pytest.approx(
      flops.count(model).forward, rel=0.03)


@pytest.mark.parametrize("name,precision,expected", [
    ("NVIDIA A100-SXM4-40GB", "bfloat16", ("A100", 312.0)),
    ("NVIDIA A100 80GB PCIe", "float32", ("A100", 156.0)),  # TF32.
    ("NVIDIA H100 80GB HBM3", "bfloat16", ("H100 SXM", 989.0)),
    ("NVIDIA H100 PCIe", "bfloat16", ("H100 PCIe", 756.0)),
    ("Tesla V100-SXM2-16GB", "float16", ("V100 SXM2", 125.0)),
    ("Tesla V100-PCIE-32GB", "float32", ("V100 PCIe", 14.0)),
    ("Tesla T4", "float16", ("T4", 65.0)),
    ("NVIDIA L4", "bfloat16", ("L4", 121.0)),
    ("Tesla T4", "bfloat16", None),  # No bfloat16 tensor cores.
    ("NVIDIA L40S", "bfloat16", None),  # Not L4.
])
def test_gpu_peak_table(name, precision, expected):
  assert peak_tables.gpu_peak(name, precision) == expected


def test_gpu_float32_without_tf32_uses_the_plain_float32_peak():
  assert peak_tables.gpu_peak("NVIDIA A100-SXM4-40GB", "float32",
                              tf32=False) == ("A100", 19.5)


@pytest.mark.parametrize("name,expected", [
    ("v2-8", ("TPU v2", 22.5)), ("v3-32", ("TPU v3", 61.5)),  # Per core.
    ("v4-8", ("TPU v4", 275.0)), ("v5litepod-16", ("TPU v5e", 197.0)),
    ("v5p-8", ("TPU v5p", 459.0)), ("v6e-4", ("TPU v6e", 918.0)),
    ("TPU v5 lite", ("TPU v5e", 197.0)), ("", None), ("v9-8", None)])
def test_tpu_peak_table(name, expected):
  assert peak_tables.tpu_peak(name, "bfloat16") == expected


def test_configured_peak_wins_and_cpu_counts_workers(mirrored):
  peak = mfu.find_peak(mirrored, "float32", 2.5, workers=1)
  assert peak == mfu.Peak(2.5, "configured", 1, "worker")
  measured = mfu.find_peak(mirrored, "float32", 0.0, workers=3)
  assert measured.source == "measured matmul" and measured.tflops > 0
  assert measured.devices == 3 and measured.total_tflops == pytest.approx(
      3 * measured.tflops)
  skipped = mfu.find_peak(mirrored, "float32", 0.0, workers=1,
                          measure=False)
  assert skipped.tflops is None


def test_negative_peak_is_a_user_error():
  config = helpers.tiny_config()
  config.log.peak_tflops = -1.0
  with pytest.raises(UserError, match=r"log.peak_tflops=-1.0"):
    validate.config(config)


def test_tiny_run_logs_mfu_and_writes_it_to_summary(tmp_path, mirrored,
                                                    capsys):
  config = helpers.tiny_config()
  config.log.progress = True  # calibration_steps stays 0: still measured.
  summary = helpers.train(config, str(tmp_path), mirrored)
  on_disk = json.load(open(os.path.join(tmp_path, "summary.json")))
  assert on_disk["peak_source"] == "measured matmul"
  assert on_disk["peak_tflops"] > 0 and on_disk["peak_devices"] == 1
  timed = on_disk["peak_timed"]  # The higher of the start's and the end's.
  assert on_disk["peak_tflops"] == max(timed.values()) and len(timed) == 2
  assert on_disk["flops_uncounted"] == []
  # Embedding(16, 8) + LSTM(16) over 12 steps + Dense(16 -> 4), x 3.
  expected = 3 * (2 * 4 * (8 + 16) * 16 * 12 + 2 * 16 * 4)
  assert on_disk["flops_per_example"] == expected
  assert on_disk["mfu"] == pytest.approx(
      expected * summary["examples_per_sec"] / 1e12 / on_disk["peak_tflops"])
  tags = helpers.scalar_tags(str(tmp_path))
  eps = dict(tags["perf/examples_per_sec"])[8]
  achieved = dict(tags["perf/model_tflops"])[8]
  assert achieved == pytest.approx(expected * eps / 1e12, rel=1e-5)
  # Logged while training: against the start's reading.
  assert dict(tags["perf/mfu"])[8] == pytest.approx(
      achieved / timed["start"], rel=1e-5)
  out = capsys.readouterr().out
  assert "FLOP/example (analytic, training = 3x forward)" in out
  assert "% MFU of" in out and "measured matmul peak, float32" in out


def test_mfu_over_100_percent_says_the_peak_is_too_low():
  """A matmul peak timed on a busy host read 104 GFLOP/s against a CNN's
  144 achieved: "138.7% MFU" with no word about it."""
  x = keras.Input((10,))
  counted = flops.count(_model(x, keras.layers.Dense(10)(x)))
  usage = mfu.Utilisation(counted, mfu.Peak(1e-9, "measured matmul", 1,
                                            "worker"), "float32")
  line = usage.line(1000.0)  # 600 FLOP/example x 1000/s = 0.6 MFLOP/s.
  assert re.search(r" = 60000\.0% MFU of 1 kFLOP/s \(measured matmul peak, "
                   r"float32\); over 100%: that peak is too low, set "
                   r"log.peak_tflops to the worker's peak TFLOP/s$", line), line
  usage = mfu.Utilisation(counted, mfu.Peak(1.0, "configured", 1, "worker"),
                          "float32")
  assert "over 100%" not in usage.line(1000.0)


def test_two_workers_peak_says_workers_not_hosts(mirrored):
  """Two worker processes on one host said `2 hosts x 45.5 GFLOP/s`: the
  peak is each worker process's, wherever it runs."""
  x = keras.Input((10,))
  counted = flops.count(_model(x, keras.layers.Dense(10)(x)))
  peak = mfu.find_peak(mirrored, "float32", 0.0455, 2)
  line = mfu.Utilisation(counted, peak, "float32").line(1e6)
  assert line.endswith("(configured peak, float32 = 2 workers x 45.5 "
                       "GFLOP/s)"), line
