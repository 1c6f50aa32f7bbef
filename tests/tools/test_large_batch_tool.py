"""tools/large_batch.py: arguments, schedules, verdicts, and one real sweep.

The control flow runs on a fake trainer that returns an accuracy per run;
the last test, marked slow, trains two tiny runs for real (~20 s here), so
the overrides the tool passes are ones the trainer accepts and the rule
reaches the run.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import common  # tools/, on sys.path (conftest.py)
import helpers
import large_batch  # tools/, on sys.path (conftest.py)

TOOL = os.path.join(helpers.REPO, "tools", "large_batch.py")


def _plan(*argv):
  return large_batch.plan(large_batch.parser().parse_args(list(argv)))


@pytest.mark.parametrize("argv,message", [
    (["--k=1"], "--k=1 must be >= 2"),
    (["--config=nope"], "--config=nope could not be loaded "
     "(FileNotFoundError: no such file: nope); pass a built-in config "
     "(cnn_cifar10"),
    (["--seeds=0,x"], "--seeds='0,x' is not a comma-separated list"),
    (["--rules=cubic:2"], "--rules item 'cubic:2' is not RULE:WARMUP_STEPS"),
    (["--rules=linear"], "--rules item 'linear' is not RULE:WARMUP_STEPS"),
    (["--rules=none:5"], "'none' takes warmup 0"),
    (["--rules=linear:101"], "--rules linear:101: warmup is longer than the "
     "100 large-batch steps; use at most 100."),
    (["--scale_steps=0.001"], "1 base steps / k=8 leave no large-batch step"),
    (["--override=train.nope=1"], "--override=train.nope names no config "
     "key; every key and its default is in dist_keras.configs.base."),
    (["--override=train.steps"], "--override=train.steps needs a value"),
    (["--override=train.lr_scaling=sqrt"], "--override=train.lr_scaling=sqrt: "
     "the tool sets train.lr_scaling for each run; use --rules instead."),
    (["--override=eval.every=5"], "the tool sets eval.every for each run."),
    (["--override=train.steps=many"], "--override=train.steps=many is not an "
     "int: write e.g. `--override=train.steps="),
    (["--override=train.momentum=2"], "train.momentum=2.0 must be in [0, 1)"),
])
def test_bad_arguments_fail_with_one_line_exit_2(argv, message, capsys):
  assert large_batch.main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("large_batch: error: ")
  assert message in lines[0]


def test_same_epochs_k_times_the_batch_for_k_times_fewer_steps():
  p = _plan("--config=cnn_shapes", "--k=8", "--scale_steps=4",
            "--rules=linear:30,none:0",
            "--override=train.global_batch_size=128")
  assert (p["batch"], p["base_steps"], p["large_steps"]) == (128, 1200, 150)
  assert p["rules"] == [("linear", 30), ("none", 0)]
  flags = large_batch.run_overrides(p, 2, 128 * 8, 150, "linear", 30)
  assert {"--config.runtime.seed=2", "--config.train.global_batch_size=1024",
          "--config.train.steps=150", "--config.train.base_batch_size=128",
          "--config.train.lr_scaling=linear",
          "--config.train.warmup_steps=30"} <= set(flags)


def test_sweep_runs_every_seed_and_rule_and_judges_against_the_base_mean(
    tmp_path, monkeypatch, capsys):
  accuracy = {"base": [1.0, 0.98], "none": [0.60, 0.99], "linear": [0.975, 1.0]}
  calls = []

  def fake_train(config, workdir, overrides):
    calls.append((config, os.path.basename(workdir), overrides))
    seed = int(next(o for o in overrides if "seed=" in o).split("=")[1])
    rule = next(o for o in overrides if "lr_scaling=" in o).split("=")[1]
    key = "base" if "base-" in workdir else rule
    return {"eval_accuracy": accuracy[key][seed], "train_loss": 0.1,
            "peak_learning_rate": 0.003}, 1.0

  monkeypatch.setattr(common, "train", fake_train)
  out = tmp_path / "result.json"
  large_batch.main(["--seeds=0,1", "--rules=none:0,linear:20", f"--out={out}",
                    "--override=train.optimizer=sgd",
                    "--override=train.global_batch_size=128"])
  assert [c[1] for c in calls] == ["base-s0", "none-w0-s0", "linear-w20-s0",
                                   "base-s1", "none-w0-s1", "linear-w20-s1"]
  assert all(c[0] == "lstm_longmem" for c in calls)
  assert all("--config.train.optimizer=sgd" in c[2] for c in calls)
  # The user's batch is the base; each run's own batch comes after it and
  # wins (absl keeps a flag's last value).
  batches = [[o for o in c[2] if "global_batch_size" in o] for c in calls]
  assert batches[0] == ["--config.train.global_batch_size=128"] * 2
  assert batches[1] == ["--config.train.global_batch_size=128",
                        "--config.train.global_batch_size=1024"]
  verdicts = {v["rule"]: v for v in json.loads(out.read_text())["verdicts"]}
  # Base mean 0.99: linear's worst seed (0.975) is 1.5 points below it.
  assert verdicts["linear"]["worst_gap"] == pytest.approx(-0.015)
  assert verdicts["linear"]["mean_gap"] == pytest.approx(-0.0025)
  assert not verdicts["linear"]["within"]
  assert not verdicts["none"]["within"]
  printed = capsys.readouterr().out
  assert re.search(r"\nlinear +20 0\.975, 1\.000 +-0\.2p +-1\.5p +no\n",
                   printed)
  large_batch.main(["--seeds=0,1", "--rules=linear:20", f"--out={out}",
                    "--tolerance=0.02"])
  assert json.loads(out.read_text())["verdicts"][0]["within"]


def test_an_interrupted_sweep_keeps_the_runs_it_finished(tmp_path,
                                                         monkeypatch):
  done = []

  def fake_train(config, workdir, overrides):
    if len(done) == 2:
      raise SystemExit("--config.runtime.seed=0 failed:\nout of memory")
    done.append(workdir)
    return {"eval_accuracy": 1.0, "train_loss": 0.1}, 1.0

  monkeypatch.setattr(common, "train", fake_train)
  out = tmp_path / "result.json"
  with pytest.raises(SystemExit, match="out of memory"):
    large_batch.main(["--seeds=0", "--rules=none:0,linear:20",
                      f"--out={out}"])
  saved = json.loads(out.read_text())
  assert [len(saved["runs"][k]) for k in ("base", "none:0", "linear:20")] == [
      1, 1, 0]
  assert [v["rule"] for v in saved["verdicts"]] == ["none"]
  assert not os.path.exists(f"{out}.tmp")


def test_a_root_with_runs_in_it_is_refused(tmp_path, monkeypatch, capsys):
  (tmp_path / "base-s0").mkdir()
  monkeypatch.setattr(common, "train", None)  # Never called.
  assert large_batch.main([f"--root={tmp_path}"]) == 2
  assert "is not empty; its runs would resume" in capsys.readouterr().err


@pytest.mark.slow
def test_real_sweep_scales_the_rate_of_the_large_run(tmp_path):
  tiny = ["train.log_every=4", "data.train_size=512", "data.eval_size=128",
          "data.seq_len=12", "model.units=16", "model.embed_dim=8",
          "log.peak_tflops=1.0"]  # No timed matmul: a known peak.
  out = tmp_path / "result.json"
  subprocess.run(
      [sys.executable, TOOL, "--k=2", "--seeds=0", "--rules=linear:2",
       "--scale_steps=0.02", f"--root={tmp_path / 'runs'}", f"--out={out}",
       *[f"--override={o}" for o in tiny]], check=True, timeout=300)
  runs = json.loads(out.read_text())["runs"]
  assert runs["base"][0]["peak_learning_rate"] == pytest.approx(0.003)
  assert runs["linear:2"][0]["peak_learning_rate"] == pytest.approx(0.006)
  with open(tmp_path / "runs" / "linear-w2-s0" / "summary.json") as f:
    summary = json.load(f)
  assert (summary["global_batch_size"], summary["steps"]) == (512, 8)
