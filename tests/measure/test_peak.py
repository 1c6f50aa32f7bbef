"""A measured peak (measure/mfu.py) is timed at a run's start and again
after its last step, the higher kept: a reading taken while other work
holds the host's cores is low, and an MFU over it silently too high."""
import json
import os

import pytest

import helpers
from dist_keras.measure import mfu


@pytest.fixture
def readings(monkeypatch):
  """Fakes the matmul timing (what mfu.py reads) with the TFLOP/s in the
  list returned, in order, on a process that has timed none yet; the list
  is left with the readings not taken."""
  left = []

  def timed(dtype="float32", device="/cpu:0"):
    assert (dtype, device) == ("float32", "/cpu:0")
    return left.pop(0)

  monkeypatch.setattr(mfu, "measure_matmul_tflops", timed)
  monkeypatch.setattr(mfu, "_BEST", {})
  return left


def test_a_low_start_reading_gives_way_to_a_higher_one_at_the_end(
    tmp_path, mirrored, readings, capsys):
  readings.extend([0.001, 0.004])  # Start: the host busy; end: not.
  config = helpers.tiny_config()
  config.log.progress = True
  summary = helpers.train(config, str(tmp_path), mirrored)
  assert not readings  # Timed twice: the start, the end.
  on_disk = json.load(open(os.path.join(tmp_path, "summary.json")))
  assert (on_disk["peak_tflops"], on_disk["peak_timed"]) == (
      0.004, {"start": 0.001, "end": 0.004})
  achieved = (on_disk["flops_per_example"] * summary["examples_per_sec"]
              / 1e12)
  assert on_disk["mfu"] == pytest.approx(achieved / 0.004)
  out = capsys.readouterr().out
  assert (f"= {100 * achieved / 0.004:.1f}% MFU of 4 GFLOP/s (measured "
          "matmul peak, float32; timed 1 GFLOP/s at the start, 4 GFLOP/s at "
          "the end: the higher kept)") in out
  # The last checkpoint kept it: a rerun that finishes the run (its
  # results lost) writes the same.
  os.remove(tmp_path / "summary.json")
  again = helpers.train(config, str(tmp_path), mirrored)
  assert (again["peak_tflops"], again["mfu"]) == (0.004, on_disk["mfu"])


def test_a_lower_reading_at_the_end_keeps_the_start_one(mirrored, readings):
  readings.extend([0.004, 0.001])
  peak = mfu.find_peak(mirrored, "float32", 0.0, workers=2)
  again = peak.timed_again("end")
  assert (again.tflops, again.total_tflops, again.timings) == (
      0.004, 0.008, (("start", 0.004), ("end", 0.001)))


def test_a_process_s_later_run_starts_from_its_best_reading(mirrored,
                                                            readings):
  """A notebook's second run times no matmul at its start."""
  readings.extend([0.002, 0.003])
  mfu.find_peak(mirrored, "float32", 0.0, workers=1).timed_again("end")
  later = mfu.find_peak(mirrored, "float32", 0.0, workers=1)
  assert later.timings == (("start", 0.003),) and not readings


def test_only_a_measured_peak_is_timed_again(mirrored, readings):
  """A configured or table peak, or a worker that does not measure, take
  no reading (`readings` is empty: one would fail)."""
  for configured, chief in ((2.5, True), (0.0, False)):
    peak = mfu.find_peak(mirrored, "float32", configured, workers=1,
                         measure=chief)
    assert peak.timed_again("end") == peak


def test_no_end_reading_where_no_mfu_is_reported(tmp_path, mirrored,
                                                 readings):
  """Too few logged steps for a throughput: no MFU, so no second timing."""
  readings.append(0.001)
  config = helpers.tiny_config()
  config.train.log_every, config.eval.every = 8, 0  # One window: the
  # warm-up, not counted.
  summary = helpers.train(config, str(tmp_path), mirrored)
  assert summary["mfu"] is None and summary["peak_timed"] == {"start": 0.001}
