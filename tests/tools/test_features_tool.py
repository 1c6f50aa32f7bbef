"""tools/features.py: variants, argument errors, and one tiny real run."""
import json

import pytest

import features  # tools/, on sys.path (conftest.py)
import helpers

# Shrinks every block to seconds (as helpers.tiny_config).
TINY = ["data.train_size=512", "data.eval_size=128", "data.seq_len=12",
        "model.units=16", "model.embed_dim=8", "train.global_batch_size=32",
        "train.log_every=2"]


def test_a_variant_is_a_list_of_overrides_and_empty_is_the_baseline():
  assert features.parse_variant("") == []
  assert features.parse_variant("train.jit_compile=True, data.threads=2") == [
      "train.jit_compile=True", "data.threads=2"]


def test_variant_config_applies_overrides_then_the_variant():
  c = features.variant_config("lstm_longmem", ["train.steps_per_loop=5"],
                              ["train.precision=bfloat16"], steps=100)
  assert (c.train.steps_per_loop, c.train.precision) == (5, "bfloat16")
  assert c.train.steps == c.train.checkpoint_every == 100
  assert c.eval.every == 0 and c.log.calibration_steps == 0


def test_a_variant_set_leads_and_repeats_are_dropped():
  args = features.parse_args(["--variant_set=sync_timing",
                              "--variant=log.sync_timing=False",
                              "--variant=train.steps_per_loop=2"])
  assert args.variants == ["", "log.sync_timing=False",
                           "train.steps_per_loop=2"]
  assert not args.configs["log.sync_timing=False"].log.sync_timing


@pytest.mark.parametrize("argv,message", [
    (["--steps=20"], "--steps=20 must cover at least two log windows"),
    (["--variant=train.steps_per_loop=4,x.y=1"],
     "--variant x.y names no config key"),
    (["--variant=", "--variant=runtime.strategy=one_device"],
     "--variant='runtime.strategy=one_device' changes runtime.strategy"),
    (["--variant_set=fast"], "argument --variant_set: invalid choice"),
])
def test_bad_arguments_fail_before_training(argv, message, capsys):
  assert features.main(argv) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("features: error: ") and message in line


@pytest.mark.parametrize("argv,bad,fine", [
    (["--steps=20", "--repeats=3"], "--steps=20 ", "--repeats"),
    (["--steps=200", "--repeats=0"], "--repeats=0 must be >= 1.", "--steps"),
    (["--warmup=-1"], "--warmup=-1 must be >= 0.", "--steps")])
def test_an_error_names_the_bad_value_only(argv, bad, fine, capsys):
  assert features.main(argv) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert bad in line and fine not in line


@pytest.mark.slow
def test_real_blocks_timing_on_and_off(tmp_path):
  out = tmp_path / "features.json"
  result = helpers.run_module(
      ["tools/features.py", "--variant_set=sync_timing", "--steps=4",
       "--repeats=1", "--warmup=0", f"--out={out}",
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "lstm_longmem: 2 replicas (MirroredStrategy), 4 steps" in (
      result.stdout)
  variants = json.loads(out.read_text())["variants"]
  assert list(variants) == ["baseline", "log.sync_timing=False"]
  assert all(v["examples_per_sec"] > 0 for v in variants.values())
  assert variants["baseline"]["sync_fraction"] > 0
  assert variants["log.sync_timing=False"]["sync_fraction"] == 0
