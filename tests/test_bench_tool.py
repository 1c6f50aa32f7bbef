"""tools/bench.py: one tiny real run of its five blocks (its figures are a
benchmark's, not checked here; argument errors are in test_tools.py)."""
import json

import pytest

import helpers

TINY = ["data.train_size=512", "data.eval_size=128", "data.seq_len=12",
        "model.units=16", "model.embed_dim=8", "train.global_batch_size=32",
        "train.log_every=2"]


@pytest.mark.slow
def test_real_blocks(tmp_path):
  out = tmp_path / "bench.json"
  result = helpers.run_module(
      ["tools/bench.py", "--steps=2", "--repeats=1", f"--out={out}",
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "lstm_longmem: 2 replicas, global batch 32, 1 x 2 steps" in (
      result.stdout)
  report = json.loads(out.read_text())
  assert list(report["ms_per_step"]) == [
      "fit, no strategy", "fit, Mirrored", "dist_keras",
      "dist_keras, timing off", "dist_keras, one device"]
  assert all(ms > 0 for ms in report["ms_per_step"].values())
  assert "timing overhead" in report["ratios"]
