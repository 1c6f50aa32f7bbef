"""tools/grid.py: the grid, its table, a failed run, and one tiny real run.

The control flow runs on a fake trainer; the last test, marked slow, trains
one tiny TFDS run for real on mock data (its own process, ~20 s here).
"""
import json

import pytest

import common  # tools/, on sys.path (conftest.py)
import grid
import helpers

# (No data.train_size or eval_size: cnn_mnist's TFDS data read neither.)
TINY = ["data.image_size=16", "model.filters=(8,)", "model.dense_units=16",
        "train.global_batch_size=32", "train.log_every=2", "train.steps=6",
        "eval.every=3",  # Each eval reads grid.MOCK_EXAMPLES examples.
        "log.peak_tflops=1.0"]  # No timed matmul at start-up.


def _args(*argv):
  return grid.parser().parse_args(list(argv))


def test_every_combination_in_order_labelled_by_its_values():
  runs = grid.plan(_args("--config=lstm_longmem,rnn_longmem",
                         "--grid=model.cell=lstm,gru",
                         "--grid=data.seq_len=50,200"))
  assert [grid.label(r) for r in runs[:3]] == [
      "lstm_longmem cell=lstm seq_len=50", "lstm_longmem cell=lstm seq_len=200",
      "lstm_longmem cell=gru seq_len=50"]
  assert len(runs) == 8 and runs[4]["config"] == "rnn_longmem"
  assert runs[0]["overrides"] == ["model.cell=lstm", "data.seq_len=50"]
  assert [r["data"] for r in runs[:1]] == ["longmem"]


@pytest.mark.parametrize("argv,message", [
    (["--grid=model.cell"], "--grid=model.cell is not SECTION.KEY=V1,V2"),
    (["--grid=model.cel=lstm"], "--grid model.cel names no config key (did "
     "you mean 'cell'?)"),
    (["--grid=model.units=16,x"], "--grid model.units=x is not an int: "
     "write e.g. `--grid model.units=64`."),
])
def test_a_bad_grid_is_named_before_any_run(argv, message, capsys):
  assert grid.main(argv) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("grid: error: ") and message in line


def test_rows_and_a_failed_run(tmp_path, monkeypatch, capsys):
  def fake_train(spec, workdir, overrides, entry):
    if "--config.model.cell=gru" in overrides:
      raise common.RunFailed("the run failed; its last lines:\nout of memory")
    assert entry == common.TRAINER  # No --mock_tfds: the plain trainer.
    return {"eval_accuracy": 0.5, "examples_per_sec": 1000.0,
            "global_batch_size": 100, "step_ms": 80.0,
            "input_wait_ms": 2.0}, 12.0

  monkeypatch.setattr(common, "train", fake_train)
  out = tmp_path / "grid.json"
  assert grid.main(["--grid=model.cell=lstm,gru", f"--out={out}"]) == 1
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].split() == ["run", "eval", "acc", "ex/s", "step", "ms",
                              "input", "ms", "%", "step", "wall", "ms", "%",
                              "wall", "wall", "s"]
  assert lines[1].split() == ["lstm_longmem", "cell=lstm", "0.5000", "1,000",
                              "80.0", "2.00", "2.5%", "100.0", "2.0%", "12"]
  assert lines[2] == "lstm_longmem cell=gru  failed: out of memory"
  rows = json.loads(out.read_text())
  assert rows[0]["wall_step_ms"] == 100.0 and rows[1]["failed"]


@pytest.mark.slow
def test_real_run_on_mock_tfds(tmp_path):
  out = tmp_path / "grid.json"
  result = helpers.run_module(
      ["tools/grid.py", "--config=cnn_mnist", "--mock_tfds", "--target=0",
       f"--root={tmp_path / 'runs'}", f"--out={out}",
       *[f"--override={o}" for o in TINY]])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "steps to 0" in result.stdout
  (row,) = json.loads(out.read_text())
  assert row["run"] == "cnn_mnist" and row["steps_to_target"] == 3
  assert [step for step, _ in row["eval_curve"]] == [3, 6]
  assert row["examples_per_sec"] > 0 and row["input_wait_ms"] > 0
  summary = common.read_summary(str(tmp_path / "runs" / "run0"))
  assert (summary["steps"], summary["global_batch_size"]) == (6, 32)
  # The mock data beside it is gone (the child's exit skips its cleanup).
  assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run0"]
