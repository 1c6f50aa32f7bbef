"""tools/bench.py: one tiny real run of its default rows (its figures are a
benchmark's, not checked here; argument errors are in test_tools.py)."""
import json

import pytest

import helpers

TINY = ["data.train_size=512", "data.eval_size=128", "data.seq_len=12",
        "model.units=16", "model.embed_dim=8", "train.global_batch_size=32"]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [["--no-fresh"], []])
def test_real_rounds(tmp_path, processes):
  out = tmp_path / "bench.json"
  result = helpers.run_module(
      ["tools/bench.py", "--rounds=1", "--epochs=1", "--steps=3",
       "--settings=defaults", f"--out={out}", *processes,
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("lstm_longmem: 2 replicas under Mirrored, global batch 32; 1 round "
          "of 1 + 1 x 3 steps") in result.stdout
  report = json.loads(out.read_text())
  assert list(report["variants"]) == [
      "fit, defaults, one", "dist_keras, defaults, one",
      "fit, defaults, mirrored", "dist_keras, defaults, mirrored"]
  for name, entry in report["variants"].items():
    assert entry["ms_per_step"] > 0, name
    # fit's per-call overhead is reported apart from its step time.
    assert ("per_call_overhead_s" in entry) == name.startswith("fit"), name
  assert set(report["ratios"]) == {"defaults, one", "defaults, mirrored"}


def test_bad_settings_are_refused(capsys):
  import bench  # pylint: disable=g-import-not-at-top
  assert bench.main(["--settings=defaults,fast"]) == 2
  assert capsys.readouterr().err == (
      "bench: error: --settings=defaults,fast: 'fast' is not a variant; use "
      "defaults, xla, bfloat16, per_call, per_call+xla, per_call+bfloat16, "
      "best, "
      "comma-separated.\n")


def test_settings_name_variants_or_groups_run_in_one_order():
  import bench  # pylint: disable=g-import-not-at-top
  assert bench.parse_args(["--settings=per_call+xla,defaults"]).variants == [
      "defaults", "per_call+xla"]
  assert bench.parse_args(["--settings=best,per_call"]).variants == [
      "xla", "bfloat16", "per_call", "per_call+xla", "per_call+bfloat16"]


def test_best_is_each_sides_fastest_variant_defaults_included():
  """An option that does not pay (here dist_keras's XLA) is not forced on a
  side, and a variant that failed (fit's per-call steps under Mirrored)
  does not count."""
  import bench  # pylint: disable=g-import-not-at-top
  args = bench.parse_args(["--rounds=1", "--settings=defaults,best"])
  rows = {"fit, defaults, one": 60.0, "dist_keras, defaults, one": 61.0,
          "fit, per_call, one": 58.0, "dist_keras, per_call, one": 55.0,
          "fit, per_call+xla, one": 57.0,
          "dist_keras, per_call+xla, one": 59.0,
          "fit, defaults, mirrored": 80.0,
          "dist_keras, defaults, mirrored": 70.0,
          "fit, per_call, mirrored": "InvalidArgumentError: placeholder",
          "dist_keras, per_call, mirrored": 50.0,
          "fit, per_call+xla, mirrored": "InvalidArgumentError: placeholder",
          "dist_keras, per_call+xla, mirrored": 52.0}
  results = {name: ms if isinstance(ms, str) else [(ms, None)]
             for name, ms in rows.items()}
  out = bench.report(results, args, replicas=2, global_batch=256)
  assert out["ratios"]["defaults, one"] == pytest.approx(60 / 61)
  assert out["ratios"]["per_call, one"] == pytest.approx(58 / 55)
  # Not both ran (fit failed, nobody ran bfloat16): no ratio.
  assert "per_call, mirrored" not in out["ratios"]
  assert "per_call+bfloat16, one" not in out["ratios"]
  assert out["ratios"]["best, one"] == pytest.approx(57 / 55)
  assert out["ratios"]["best, mirrored"] == pytest.approx(80 / 50)
  assert out["variants"]["fit, per_call, mirrored"] == {
      "error": "InvalidArgumentError: placeholder"}


def test_the_fit_side_trains_a_users_own_compiled_model(monkeypatch):
  """model.name / data.name = PKG.MODULE:FN: fit trains the user's model as
  they compiled it (loss, metrics, optimizer), on their pipeline as it is,
  with fit's speed options set on it (tests/user_task.py: MSE, MAE, SGD;
  batches of (x, y, sample_weight))."""
  import bench  # pylint: disable=g-import-not-at-top
  import common  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from dist_keras.contract import checks  # pylint: disable=g-import-not-at-top
  built = []
  call_model_fn = checks.call_model_fn
  monkeypatch.setattr(checks, "call_model_fn", lambda *a: built.append(
      call_model_fn(*a)) or built[-1])
  args = bench.parse_args([
      "--epochs=1", "--steps=4", "--per_call=2",
      "--override=model.name=user_task:model_fn",
      "--override=data.name=user_task:dataset_fn",
      "--override=train.global_batch_size=48"])
  c = common.load_config(args.config, args.override)
  run = bench.fit_runner(c, tf.distribute.get_strategy(), args,
                         per_call=True, xla=False, precision="float32")
  ms, overhead = run()
  assert ms > 0 and overhead >= 0
  [model] = built
  assert model.steps_per_execution == 2 and not model.jit_compile
  assert type(model.optimizer).__name__ == "SGD"
  assert model.loss == "mse"
  assert int(model.optimizer.iterations.numpy()) == 2 * 4  # 1 + 1 epochs.
  assert "mae" in model.get_metrics_result()


def test_a_fresh_run_is_one_process_of_this_script(monkeypatch):
  """By default each run is `bench.py ... --only=NAME` in a new process; its
  result line carries ms/step, fit's overhead and the Mirrored replicas;
  a process that fails names its exit code and its run's error line, or
  stderr's last line if the run printed none."""
  import subprocess  # pylint: disable=g-import-not-at-top

  import bench  # pylint: disable=g-import-not-at-top
  import common  # pylint: disable=g-import-not-at-top
  args = bench.parse_args(["--steps=7", "--override=model.units=8"])
  assert args.fresh and not bench.parse_args(["--no-fresh"]).fresh
  calls = []

  # pylint: disable=protected-access
  outcomes = {  # Each run's (exit code, stdout, stderr).
      "fit, defaults, mirrored": (0, bench._RESULT + "[12.5, 0.25, 2]\n", ""),
      "dist_keras, defaults, one": (
          1, "", "warming up\nValueError: no such layer\n"),
      "fit, defaults, one": (
          1, bench._ERROR + "ValueError: bad fit\n",
          "warming up\nValueError: no such layer\n0 derived errors ignored.\n"),
  }
  # pylint: enable=protected-access

  def fake(command, **kwargs):
    calls.append(command)
    code, stdout, stderr = outcomes[command[-1][len("--only="):]]
    return subprocess.CompletedProcess(command, code, stdout=stdout,
                                       stderr=stderr)

  monkeypatch.setattr(subprocess, "run", fake)
  seen = {}
  ms = bench.fresh_runner(args, "fit, defaults, mirrored", seen)()
  assert ms == (12.5, 0.25) and seen == {"replicas": 2}
  assert calls[0][1].endswith("tools/bench.py")
  assert calls[0][2:] == ["--config=lstm_longmem", "--override=model.units=8",
                          "--epochs=4", "--steps=7", "--per_call=25",
                          "--only=fit, defaults, mirrored"]
  with pytest.raises(RuntimeError, match=(
      "its process exited 1: ValueError: no such layer")):
    bench.fresh_runner(args, "dist_keras, defaults, one", seen)()
  with pytest.raises(common.ChildFailed, match=(
      "^its process exited 1: ValueError: bad fit$")):
    bench.fresh_runner(args, "fit, defaults, one", seen)()
  with pytest.raises(Exception, match="--only=fit, defaults, moon: not one"):
    bench.parse_args(["--only=fit, defaults, moon"])


def test_a_users_batches_of_another_size_are_refused_whole():
  """Examples/s counts train.global_batch_size a step: a user's dataset_fn
  batching 48 with the config's 256 left made fit's figure 5.3x too high
  (the run 'succeeded'); dist_keras's refusal was cut at 160 characters,
  its fix lost."""
  import bench  # pylint: disable=g-import-not-at-top
  import common  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  args = bench.parse_args([
      "--epochs=1", "--steps=2", "--override=model.name=user_task:model_fn",
      "--override=data.name=user_task:dataset_fn"])
  assert args.model == "user_task:model_fn on user_task:dataset_fn"
  c = common.load_config(args.config, args.override)
  with pytest.raises(Exception) as e:
    bench.fit_runner(c, tf.distribute.get_strategy(), args, per_call=False,
                     xla=False, precision="float32")
  line = common.one_line(e.value)
  assert line == (
      "dataset_fn('train', ...) of one input pipeline yields batches of 48 "
      f"examples, not train.global_batch_size={c.train.global_batch_size}; "
      "batch with input_context.get_per_replica_batch_size("
      "global_batch_size), or pass --override=train.global_batch_size=N for"
      " its batches of N.")


@pytest.mark.parametrize("name", ["text", "cnn", "wide_deep", "deep_mlp"])
def test_bench_models_train_on_their_own_batches(name, monkeypatch):
  """tools/bench_models.py, which docs/performance.md's own-model figures
  name: each compiled model takes a step on its dataset_fn's batches of
  its global batch (one pipeline), and the eval split ends."""
  import bench_models  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # deep_mlp's 48 blocks are there to be slow to trace (a minute of CI
  # here); 2 build and train the same way.
  monkeypatch.setattr(bench_models, "MLP_BLOCKS", 2)
  model = getattr(bench_models, f"{name}_model_fn")()
  dataset_fn = getattr(bench_models, f"{name}_dataset_fn")
  x, y = next(iter(dataset_fn("train", tf.distribute.InputContext())))
  sizes = {t.shape[0] for t in tf.nest.flatten(x)}
  assert sizes == {{"text": bench_models.TEXT_BATCH,
                    "cnn": bench_models.IMG_BATCH,
                    "wide_deep": bench_models.WD_BATCH,
                    "deep_mlp": bench_models.MLP_BATCH}[name]}
  logs = model.train_on_batch(x, y, return_dict=True)
  assert all(float(v) == float(v) for v in logs.values()), logs  # Not NaN.
  eval_ds = dataset_fn("eval", tf.distribute.InputContext())
  assert eval_ds.cardinality().numpy() > 0
