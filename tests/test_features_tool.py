"""tools/features.py: variant parsing and argument errors (not its figures)."""

import helpers

import features  # pylint: disable=g-import-not-at-top,wrong-import-position


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


def test_too_few_steps_fail_before_training():
  result = helpers.run_module(["tools/features.py", "--steps=20"], timeout=60)
  assert result.returncode == 2
  assert "--steps=20 must cover at least two log windows" in result.stderr
