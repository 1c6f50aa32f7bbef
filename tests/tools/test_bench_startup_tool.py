"""tools/bench_startup.py: its argument errors and its report in CI; one
tiny real round of its three sides in the slow set (its figures are a
benchmark's, not checked here)."""
import argparse
import json

import pytest

import helpers

TINY = ["data.train_size=512", "data.eval_size=64", "data.seq_len=12",
        "model.units=16", "train.global_batch_size=32"]


@pytest.mark.parametrize("argv, message", [
    (["--steps=0"], "--steps=0 must be >= 1."),
    (["--rounds=-1"], "--rounds=-1 must be >= 1."),
    (["--only=fat"], "--only=fat: use one of fit, dist_keras, "
     "dist_keras_lean."),
])  # --config and --override: test_tools.py, as every tool's.
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, message):
  import bench_startup  # pylint: disable=g-import-not-at-top
  assert bench_startup.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"bench_startup: error: {message}"), err
  assert len(err.strip().splitlines()) == 1


def test_the_report_gives_medians_ranges_and_fits_call_over_each():
  import bench_startup  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(steps=60, strategy="one", rounds=3)
  out = bench_startup.report({
      "fit": [(2.5, 7.5), (2.4, 7.4), (2.6, 7.6)],
      "dist_keras": [(2.9, 8.0), (3.0, 8.4), (2.8, 8.2)],
      "dist_keras_lean": [(2.4, 5.8), (2.3, 5.6), (2.5, 5.7)]}, args)
  assert out["sides"]["fit"]["call_s"] == 7.5
  assert out["sides"]["dist_keras"]["first_step_s"] == 2.9
  assert out["ratios"] == pytest.approx(
      {"dist_keras": 7.5 / 8.2, "dist_keras_lean": 7.5 / 5.7})


@pytest.mark.slow
def test_one_real_round(tmp_path):
  out = tmp_path / "startup.json"
  result = helpers.run_module(
      ["tools/bench_startup.py", "--rounds=1", "--steps=3", f"--out={out}",
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "fit / dist_keras_lean (whole call): " in result.stdout
  report = json.loads(out.read_text())
  assert list(report["sides"]) == ["fit", "dist_keras", "dist_keras_lean"]
  for side, entry in report["sides"].items():
    assert 0 < entry["first_step_s"] < entry["call_s"], side
