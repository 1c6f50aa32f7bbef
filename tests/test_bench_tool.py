"""tools/bench.py: one tiny real run of its default rows (its figures are a
benchmark's, not checked here; argument errors are in test_tools.py)."""
import json

import pytest

import helpers

TINY = ["data.train_size=512", "data.eval_size=128", "data.seq_len=12",
        "model.units=16", "model.embed_dim=8", "train.global_batch_size=32"]


@pytest.mark.slow
def test_real_rounds(tmp_path):
  out = tmp_path / "bench.json"
  result = helpers.run_module(
      ["tools/bench.py", "--rounds=1", "--epochs=1", "--steps=3",
       "--settings=defaults", f"--out={out}",
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("lstm_longmem: 2 replicas under Mirrored, global batch 32; 1 rounds "
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


def test_bad_settings_are_refused():
  import bench  # pylint: disable=g-import-not-at-top
  assert bench.main(["--settings=fast"]) == 2
