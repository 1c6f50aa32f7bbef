"""tools/scaling.py: arguments, the efficiency math, the plot, HParams, runs.

The report (the math, the table, scaling.json, the plot and HParams) is
tools/scaling_report.py's.

Everything but the last test is fast: the math and the outputs work on
fabricated summary.json files, and the sweep's control flow (a failed point,
the rest going on, exit 1) runs small Python snippets in place of training.
The last test, marked slow, is ONE real sweep of tiny runs end to end:
1 and 2 replicas in one process and 2 workers on 127.0.0.1 (~60 s here).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import common  # tools/, on sys.path by conftest.py
import helpers
import scaling  # tools/, on sys.path by conftest.py
import scaling_report  # tools/, on sys.path by conftest.py

TOOL = os.path.join(helpers.REPO, "tools", "scaling.py")
# Shrinks every run of the real sweep to seconds (as helpers.tiny_config).
TINY = ["--config.train.log_every=4", "--config.train.checkpoint_every=100",
        "--config.data.train_size=512", "--config.data.eval_size=128",
        "--config.data.seq_len=12", "--config.model.units=16",
        "--config.model.embed_dim=8",
        # A known MFU peak: no timed matmul at start (test_flops.py times it).
        "--config.log.peak_tflops=1.0"]


def _summary(replicas, batch, rate, steps=300, **extra):
  """A summary.json as the trainer writes it (the keys the tool reads)."""
  return {"strategy": "x", "replicas": replicas, "steps": steps,
          "global_batch_size": batch, "examples_per_sec": rate,
          "examples_per_sec_per_replica": rate / replicas,
          "sync_fraction": 0.1 * (replicas > 1), "allreduce_ms": 0.3,
          "straggler_ms": 1.0, "compute_ms": 20.0, "input_wait_ms": 0.5,
          "step_ms": 22.0, **extra}


def _points(args):
  return {p.name: p for p in scaling.parse_args(["--no_plot", *args]).points}


# ---- arguments ---------------------------------------------------------------


def test_weak_scaling_fixes_the_batch_per_replica(tmp_path):
  points = _points([f"--out={tmp_path / 'new'}"])
  assert list(points) == ["replicas_1", "replicas_2", "replicas_4",
                          "workers_2", "workers_3"]
  # lstm_longmem: global batch 256 over its default 2 replicas.
  assert {n: p.global_batch for n, p in points.items()} == {
      "replicas_1": 128, "replicas_2": 256, "replicas_4": 512,
      "workers_2": 256, "workers_3": 384}
  assert {p.per_replica_batch for p in points.values()} == {128}
  assert [p.strategy for p in points.values()] == [
      "one_device", "mirrored", "mirrored", "multi_worker_mirrored",
      "multi_worker_mirrored"]
  assert points["workers_3"].replicas == points["workers_3"].workers == 3
  assert points["replicas_4"].workers == 1
  small = _points([f"--out={tmp_path}/n", "--per_replica_batch=32",
                   "--replicas=2", "--workers="])
  assert small["replicas_2"].global_batch == 64


def test_strong_scaling_fixes_the_global_batch(tmp_path):
  out = f"--out={tmp_path / 'new'}"
  # 256 is not divisible by 3: rounded up to a multiple of 1, 2, 3 and 4.
  assert {p.global_batch for p in _points([out, "--mode=strong"]).values()
          } == {264}
  points = _points([out, "--mode=strong", "--global_batch=384"])
  assert {p.global_batch for p in points.values()} == {384}
  assert points["replicas_4"].per_replica_batch == 96
  assert {p.global_batch for p in _points(
      [out, "--mode=strong", "--workers=", "--replicas=1,2"]).values()
          } == {256}


@pytest.mark.parametrize("args, message", [
    (["--replicas=1,x"], "--replicas='1,x' must be comma-separated integers"),
    (["--replicas=0,2"], "must be comma-separated integers >= 1"),
    (["--replicas=2,2"], "names a count twice"),
    (["--workers=1"], "--workers='1' must be comma-separated integers >= 2"),
    (["--replicas=", "--workers="], "are both empty"),
    (["--config=nope"], "--config=nope could not be loaded"),
    (["--config=/tmp/lstm_longmem.py"],
     "--config=/tmp/lstm_longmem.py: there is no file /tmp/lstm_longmem.py "
     "here; pass --config=lstm_longmem"),
    (["--steps=30"], "--steps=30 would time only 5 step(s)"),
    (["--mode=fast"], "argument --mode: invalid choice: 'fast'"),
    (["--mode=strong", "--global_batch=250"],
     "--global_batch=250 does not split over 4 replicas; use a multiple of "
     "12, e.g. 252"),
    (["--mode=strong", "--per_replica_batch=8"],
     "--per_replica_batch is for --mode=weak"),
    (["--global_batch=256"], "--global_batch is for --mode=strong"),
    (["--per_replica_batch=0"], "--per_replica_batch=0 must be >= 1"),
    (["--repeats=0"], "--repeats=0 must be >= 1"),
    (["--timeout=0"], "--timeout=0.0 must be > 0"),
    (["--", "--config.train.steps=5"],
     "--config.train.steps is set by the sweep for each point; use --steps"),
    (["--", "--config.runtime.strategy=mirrored"],
     "--config.runtime.strategy is set by the sweep"),
    (["--", "--config.train.global_batch_size=64"],
     "use --per_replica_batch (weak) or --global_batch (strong)"),
    (["--", "--config.model.unitz=3"],
     "--config.model.unitz names no config key (did you mean 'units'?)"),
    (["--", "--config.model.units=many"],
     "--config.model.units=many is not an int: write e.g. "
     "`--config.model.units=64`."),
    (["--", "units=3"], "'units=3' after -- must be --config.SECTION.KEY"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_one_line_exit_2_nothing_written(tmp_path, capsys,
                                                       args, message):
  out = tmp_path / "out"
  assert scaling.main([f"--out={out}", *args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("scaling: error: ") and message in err, err
  assert err.count("\n") == 1
  assert not out.exists()


def test_missing_out_is_an_error(capsys):
  assert scaling.main(["--replicas=1"]) == 2
  assert "the following arguments are required: --out" in (
      capsys.readouterr().err)


def test_missing_matplotlib_says_which_extra(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # Import fails.
  assert scaling.main([f"--out={tmp_path / 'o'}"]) == 2
  assert 'matplotlib is needed for scaling.png: pip install -e ".[tools]" ' \
      "(or pass --no_plot)" in capsys.readouterr().err
  scaling.parse_args([f"--out={tmp_path / 'o'}", "--no_plot"])  # Fine.


def test_out_must_be_new_or_a_previous_sweep(tmp_path):
  (tmp_path / "replicas_1").mkdir()
  (tmp_path / "scaling.json").write_text("{}")
  with pytest.raises(scaling.BadInput, match="is not empty .*--overwrite"):
    scaling.check_out(str(tmp_path), overwrite=False)
  scaling.check_out(str(tmp_path), overwrite=True)  # Only its own entries.
  scaling.clear_out(str(tmp_path))
  assert not os.listdir(tmp_path)
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(scaling.BadInput, match="holds notes.txt, which this "
                     "tool did not write"):
    scaling.check_out(str(tmp_path), overwrite=True)
  assert (tmp_path / "notes.txt").exists()
  (tmp_path / "f").write_text("")
  with pytest.raises(scaling.BadInput, match="is a file"):
    scaling.check_out(str(tmp_path / "f"), overwrite=True)


def test_commands_set_strategy_devices_batch_and_keep_user_overrides(
    tmp_path):
  args = scaling.parse_args([f"--out={tmp_path / 'o'}", "--no_plot",
                             "--steps=100", "--", "--config.model.units=16",
                             "--config.eval.every=50"])
  points = {p.name: p for p in args.points}
  one = scaling.train_command(points["replicas_1"], args, "/w")
  assert one[1].endswith(os.path.join("tools", "pin_cores.py"))
  assert one[2:4] == [f"--cores={points['replicas_1'].cores[0][0]}", "--"]
  assert one[5:7] == ["-m", "dist_keras.train"]
  assert "--config.runtime.strategy=one_device" in one
  assert "--config.runtime.num_cpu_devices=1" in one
  assert "--config.train.global_batch_size=128" in one
  assert "--config.train.steps=100" in one and "--workdir=/w" in one
  four = scaling.train_command(points["replicas_4"], args, "/w")
  assert "--config.runtime.strategy=mirrored" in four
  assert "--config.runtime.num_cpu_devices=4" in four
  # The user's overrides come after the tool's defaults: absl's last wins.
  assert four.index("--config.eval.every=50") > four.index(
      "--config.eval.every=0")
  assert four[-2:] == ["--config.model.units=16", "--config.eval.every=50"]
  three = scaling.train_command(points["workers_3"], args, "/w")
  assert three[1].endswith(os.path.join("tools", "launch_local.py"))
  assert three[2:4] == ["--num_workers=3", "--"]
  assert "--config.runtime.strategy=multi_worker_mirrored" in three
  assert "--config.runtime.num_cpu_devices=1" in three
  assert "--config.train.global_batch_size=384" in three
  # Each worker pins itself to its task's core set, then execs the trainer.
  assert three[5].endswith(os.path.join("tools", "pin_cores.py"))
  assert three[6] == "--cores=" + "/".join(
      ",".join(map(str, c)) for c in points["workers_3"].cores)
  assert three[7:10] == ["--", sys.executable, "-m"]
  unpinned = scaling.parse_args([f"--out={tmp_path / 'o'}", "--no_plot",
                                 "--cores_per_replica=0"]).points
  assert all(p.cores == () for p in unpinned)
  command = scaling.train_command(unpinned[1], args, "/w")
  assert not any("pin_cores" in part for part in command)
  assert command[1:3] == ["-m", "dist_keras.train"]
  # A config file's path reaches the runs (started in the checkout) whole.
  shapes = os.path.join(helpers.REPO, "configs", "cnn_shapes.py")
  args = scaling.parse_args([f"--out={tmp_path / 'o'}", "--no_plot",
                             f"--config={os.path.relpath(shapes)}"])
  assert f"--config={shapes}" in scaling.train_command(args.points[0], args,
                                                       "/w")


def test_pinning_gives_each_replica_its_own_cores(tmp_path):
  args = scaling.parse_args([f"--out={tmp_path / 'o'}", "--no_plot"])
  config = scaling.load_config("lstm_longmem", [])
  cores = {p.name: p for p in scaling.plan(args, config, [0, 1])}
  assert {n: p.cores for n, p in cores.items()} == {
      "replicas_1": ((0,),), "replicas_2": ((0, 1),),
      "replicas_4": ((0, 1),),  # 4 replicas, 2 cores: shared.
      "workers_2": ((0,), (1,)), "workers_3": ((0,), (1,), (0,))}
  assert [n for n, p in cores.items() if p.oversubscribed(2)] == [
      "replicas_4", "workers_3"]
  args.cores_per_replica = 2
  wide = {p.name: p for p in scaling.plan(args, config, [2, 3, 5, 7, 8, 9])}
  assert wide["replicas_2"].cores == ((2, 3, 5, 7),)
  assert wide["workers_3"].cores == ((2, 3), (5, 7), (8, 9))
  assert wide["replicas_4"].cores == ((2, 3, 5, 7, 8, 9),)
  assert [n for n, p in wide.items() if p.oversubscribed(6)] == [
      "replicas_4"]
  # Unpinned, every run takes every core: more replicas than cores share.
  args.cores_per_replica = 0
  assert [p.name for p in scaling.plan(args, config, [0, 1])
          if p.oversubscribed(2)] == ["replicas_4", "workers_3"]


PIN = os.path.join(helpers.REPO, "tools", "pin_cores.py")
PRINT_AFFINITY = [sys.executable, "-c",
                  "import os; print(sorted(os.sched_getaffinity(0)))"]


def _pinned(cores: str, tf_config=None):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  if tf_config is not None:
    env["TF_CONFIG"] = json.dumps(tf_config)
  return subprocess.run([sys.executable, PIN, f"--cores={cores}", "--",
                         *PRINT_AFFINITY], env=env, capture_output=True,
                        text=True, check=False, timeout=60)


def test_pin_cores_sets_the_affinity_of_the_command():
  available = sorted(os.sched_getaffinity(0))
  last = available[-1]
  result = _pinned(str(last))
  assert (result.returncode, result.stdout) == (0, f"[{last}]\n")
  # Per task: TF_CONFIG's task index picks the set.
  task = {"cluster": {"worker": ["a:1", "b:2"]},
          "task": {"type": "worker", "index": 1}}
  result = _pinned(f"{available[0]}/{last}", task)
  assert result.stdout == f"[{last}]\n", result.stderr
  assert _pinned(f"{available[0]}/{last}").stdout == f"[{available[0]}]\n"


@pytest.mark.parametrize("cores, tf_config, message", [
    ("x", None, "--cores='x' must be comma-separated core numbers"),
    ("9999", None, "cores [9999] are not available to this process"),
    ("0/0", {"task": {"type": "worker", "index": 2}},
     "task index 2 but --cores names 2 set(s)"),
    ("0/0", {"cluster": {}}, "TF_CONFIG has no task index"),
])
def test_pin_cores_bad_input_exit_2(cores, tf_config, message):
  result = _pinned(cores, tf_config)
  assert result.returncode == 2
  assert result.stderr.startswith("pin_cores: error: ") and message in (
      result.stderr), result.stderr
  assert not result.stdout  # The command never ran.


def test_child_env_drops_tf_config_and_puts_this_checkout_first(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  env = scaling.child_env()
  assert "TF_CONFIG" not in env
  assert env["PYTHONPATH"] == helpers.REPO + os.pathsep + "/elsewhere"


# ---- the math on fabricated summaries ----------------------------------------


def _write_summaries(root, plan: dict) -> dict:
  """Writes {point: [summary, ...]} as files; returns them read back."""
  read = {}
  for name, summaries in plan.items():
    for i, summary in enumerate(summaries):
      workdir = root / f"{name}-{i}"
      workdir.mkdir()
      (workdir / "summary.json").write_text(json.dumps(summary))
      read.setdefault(name, []).append(common.read_summary(str(workdir)))
  return read


def _sweep_points(tmp_path, *extra):
  return scaling.parse_args([f"--out={tmp_path / 'out'}", "--no_plot",
                             *extra]).points


def test_efficiency_weak_scaling(tmp_path):
  points = _sweep_points(tmp_path)
  summaries = _write_summaries(tmp_path, {
      "replicas_1": [_summary(1, 128, 1000.0)],
      "replicas_2": [_summary(2, 256, 1800.0)],
      "replicas_4": [_summary(4, 512, 2000.0, sync_fraction=0.25)],
      "workers_2": [_summary(2, 256, 1500.0)],
  })  # workers_3 failed: no summary.
  for p in points:
    for s in summaries.get(p.name, []):
      scaling.check_summary(p, s, 300)
  rows = {r["point"]: r for r in scaling_report.results(points, summaries)}
  assert rows["replicas_1"]["scaling_efficiency"] == 1.0
  assert rows["replicas_2"]["speedup"] == pytest.approx(1.8)
  assert rows["replicas_2"]["scaling_efficiency"] == pytest.approx(0.9)
  assert rows["replicas_2"]["examples_per_sec_per_replica"] == 900.0
  assert rows["replicas_4"]["scaling_efficiency"] == pytest.approx(0.5)
  assert rows["replicas_4"]["sync_fraction"] == 0.25
  assert rows["workers_2"]["scaling_efficiency"] == pytest.approx(0.75)
  assert rows["workers_3"]["examples_per_sec"] is None
  assert rows["workers_3"]["scaling_efficiency"] is None
  table = scaling_report.format_table(list(rows.values())).splitlines()
  assert table[0].split()[:4] == ["point", "replicas", "batch", "ex/s"]
  r2 = table[2].split()
  assert r2[:6] == ["replicas_2", "2", "256", "1,800", "900", "1.80"]
  assert r2[6] == "90%" and r2[-1] == "10%"  # Efficiency, sync fraction.
  assert table[3].split()[6] == "50%"
  assert table[5].split()[:4] == ["workers_3", "3", "384", "-"]
  assert table[5].endswith("(failed)")


def test_strong_scaling_and_repeats_use_medians(tmp_path):
  points = _sweep_points(tmp_path, "--mode=strong", "--replicas=1,2",
                         "--workers=", "--repeats=3")
  summaries = _write_summaries(tmp_path, {
      "replicas_1": [_summary(1, 256, r) for r in (900.0, 1000.0, 1300.0)],
      "replicas_2": [_summary(2, 256, r) for r in (1700.0, 2000.0, 1500.0)],
  })
  rows = scaling_report.results(points, summaries)
  assert [r["examples_per_sec"] for r in rows] == [1000.0, 1700.0]
  assert (rows[0]["examples_per_sec_min"],
          rows[0]["examples_per_sec_max"]) == (900.0, 1300.0)
  assert rows[1]["examples_per_sec_runs"] == [1700.0, 2000.0, 1500.0]
  assert rows[1]["speedup"] == pytest.approx(1.7)
  assert rows[1]["scaling_efficiency"] == pytest.approx(0.85)
  table = scaling_report.format_table(rows).splitlines()
  assert table[0].split()[-1] == "spread"
  assert table[1].split()[-1] == "40%"  # (1300 - 900) / 1000.


def test_no_one_replica_point_no_efficiency(tmp_path):
  points = _sweep_points(tmp_path, "--replicas=2", "--workers=2")
  summaries = {"replicas_2": [_summary(2, 256, 1800.0)],
               "workers_2": [_summary(2, 256, 1500.0)]}
  rows = scaling_report.results(points, summaries)
  assert [r["scaling_efficiency"] for r in rows] == [None, None]
  assert rows[0]["examples_per_sec_per_replica"] == 900.0
  table = scaling_report.format_table(rows).splitlines()
  assert table[1].split()[5:7] == ["-", "-"]


def test_summaries_that_do_not_match_the_point_are_refused(tmp_path):
  point = {p.name: p for p in _sweep_points(tmp_path)}["replicas_4"]
  scaling.check_summary(point, _summary(4, 512, 1.0), 300)
  for summary, message in [
      (_summary(2, 512, 1.0), "replicas=2, the sweep asked for 4"),
      (_summary(4, 512, 1.0, steps=0), "steps=0, the sweep asked for 300"),
      (_summary(4, 256, 1.0), "global_batch_size=256, the sweep asked"),
      (_summary(4, 512, 1.0, examples_per_sec=None), "no examples_per_sec")]:
    with pytest.raises(ValueError, match=message):
      scaling.check_summary(point, summary, 300)
  with pytest.raises(ValueError, match="no readable .*summary.json"):
    common.read_summary(str(tmp_path))
  (tmp_path / "summary.json").write_text('{"replicas": ')
  with pytest.raises(ValueError, match="is not valid JSON"):
    common.read_summary(str(tmp_path))


# ---- outputs -----------------------------------------------------------------


def _report(tmp_path, rows):
  return {"config": "lstm_longmem", "mode": "weak", "steps": 300,
          "repeats": 2, "per_replica_batch": 128, "global_batch_size": None,
          "cores_per_replica": 1,
          "host": {"cores": 2, "machine": "x86_64", "tensorflow": "2.21.0"},
          "oversubscribed": ["replicas_4", "workers_3"],
          "baseline_examples_per_sec": scaling_report.baseline_rate(rows),
          "points": rows}


@pytest.mark.slow
def test_plot_is_written_whole(tmp_path):
  """Slow set: it needs the tools extra's matplotlib, which CI's test extra
  leaves out (setup.py says why)."""
  image = pytest.importorskip(
      "matplotlib.image", reason='the plot needs pip install -e ".[tools]"')
  points = _sweep_points(tmp_path, "--repeats=2")
  rows = scaling_report.results(points, {
      "replicas_1": [_summary(1, 128, 1000.0), _summary(1, 128, 1100.0)],
      "replicas_2": [_summary(2, 256, 1800.0)],
      "replicas_4": [_summary(4, 512, 2000.0)],
      "workers_2": [_summary(2, 256, 1500.0)],
      "workers_3": []})  # A failed point is left out of the figure.
  path = tmp_path / "scaling.png"
  scaling_report.plot(_report(tmp_path, rows), str(path))
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  height, width = image.imread(str(path)).shape[:2]
  assert width > 1000 and height > 400
  assert os.listdir(tmp_path) == ["scaling.png"]  # No temporary left.
  assert "shaded: replicas share cores" in scaling_report._title(
      _report(tmp_path, rows))


def test_a_failed_write_leaves_nothing(tmp_path):
  path = tmp_path / "scaling.json"

  def half_then_fail(tmp):
    with open(tmp, "w") as f:
      f.write('{"half": ')
    raise OSError("disk full")

  with pytest.raises(OSError):
    common.write_atomically(str(path), half_then_fail)
  assert not os.listdir(tmp_path)
  common.write_json(str(path), {"a": 1})
  assert json.loads(path.read_text()) == {"a": 1}


def hparams_tab(logdir: str):
  """What TensorBoard's HParams tab shows for `logdir`, from its backend:
  (the experiment, {session group name: group}) as protos."""
  # pylint: disable=g-import-not-at-top
  from tensorboard import context
  from tensorboard.backend.event_processing import data_provider
  from tensorboard.backend.event_processing import plugin_event_multiplexer
  from tensorboard.plugins import base_plugin
  from tensorboard.plugins.hparams import api_pb2
  from tensorboard.plugins.hparams import backend_context
  from tensorboard.plugins.hparams import get_experiment
  from tensorboard.plugins.hparams import list_session_groups
  # pylint: enable=g-import-not-at-top
  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(logdir)
  mux.Reload()
  backend = backend_context.Context(base_plugin.TBContext(
      logdir=logdir, multiplexer=mux,
      data_provider=data_provider.MultiplexerDataProvider(mux, logdir)))
  experiment = get_experiment.Handler(
      context.RequestContext(), backend, "",
      api_pb2.GetExperimentRequest()).run()
  groups = list_session_groups.Handler(
      context.RequestContext(), backend, "", api_pb2.ListSessionGroupsRequest(
          start_index=0, slice_size=100,
          allowed_statuses=[api_pb2.STATUS_UNKNOWN,
                            api_pb2.STATUS_SUCCESS])).run()
  return experiment, {g.name: g for g in groups.session_groups}


def _metrics(group) -> dict:
  return {m.name.tag: m.value for m in group.metric_values}


def _hparams(group) -> dict:
  return {k: v.string_value or v.number_value for k, v in
          group.hparams.items()}


def test_hparams_tab_sets_the_points_side_by_side(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  points = _sweep_points(tmp_path, "--replicas=1,2", "--workers=2")
  out = str(tmp_path / "out")
  scaling_report.write_hparams_config(out, points, "lstm_longmem", "weak")
  rates = {"replicas_1": 1000.0, "replicas_2": 1800.0, "workers_2": 1500.0}
  for p in points:
    workdir = os.path.join(out, p.name)
    # The trainer's own events share the folder, as in a real sweep.
    with tf.summary.create_file_writer(workdir).as_default(step=8):
      tf.summary.scalar("loss", 0.5)
    scaling_report.write_run_hparams(
        workdir, p, "lstm_longmem", "weak", 300,
        _summary(p.replicas, p.global_batch, rates[p.name]), baseline=1000.0)
  experiment, groups = hparams_tab(out)
  assert {h.name for h in experiment.hparam_infos} == {
      "config", "mode", "strategy", "replicas", "workers",
      "global_batch_size", "per_replica_batch", "cores_per_replica"}
  assert [m.name.tag for m in experiment.metric_infos] == [
      t for t, _ in scaling_report.METRICS]
  assert set(groups) == set(rates)
  assert _hparams(groups["workers_2"]) == {
      "config": "lstm_longmem", "mode": "weak",
      "strategy": "multi_worker_mirrored", "replicas": 2, "workers": 2,
      "global_batch_size": 256, "per_replica_batch": 128,
      "cores_per_replica": 1}
  metrics = _metrics(groups["replicas_2"])
  assert metrics["scaling/examples_per_sec"] == 1800.0
  assert metrics["scaling/examples_per_sec_per_replica"] == 900.0
  assert metrics["scaling/efficiency"] == pytest.approx(0.9)
  assert metrics["scaling/sync_fraction"] == pytest.approx(0.1)
  assert _metrics(groups["workers_2"])["scaling/efficiency"] == (
      pytest.approx(0.75))


# ---- running -----------------------------------------------------------------


def test_run_command_exit_code_log_and_timeout(tmp_path):
  log = str(tmp_path / "train.log")
  code, _ = scaling.run_command(
      [sys.executable, "-c", "import sys\nfor i in range(30): print(i)\n"
       "print('boom', file=sys.stderr); sys.exit(3)"], log, timeout=60)
  assert code == 3
  assert scaling.tail(log)[-2:] == ["29", "boom"]
  assert len(scaling.tail(log)) == scaling.TAIL_LINES
  code, seconds = scaling.run_command(
      [sys.executable, "-c", "import time; time.sleep(60)"], log, timeout=1)
  assert code is None and seconds < 10  # SIGTERM stopped it at once.


def _fake_trainer(fail: str):
  """train_command's stand-in: each 'run' writes a fabricated summary.json
  at once, except point `fail`, which prints and exits 200."""
  def command(point, args, workdir):
    if point.name == fail:
      return [sys.executable, "-c", "import sys; print('step 4/8');"
              "print('lost contact with task worker:1', file=sys.stderr);"
              "sys.exit(200)"]
    rate = {1: 1000.0, 2: 1800.0}[point.replicas]
    summary = _summary(point.replicas, point.global_batch, rate,
                       steps=args.steps)
    return [sys.executable, "-c", "import json, sys; json.dump(json.loads("
            "sys.argv[1]), open(sys.argv[2], 'w'))", json.dumps(summary),
            os.path.join(workdir, "summary.json")]
  return command


def test_a_failed_point_is_reported_and_the_sweep_goes_on(tmp_path, capsys,
                                                          monkeypatch):
  monkeypatch.setattr(scaling, "train_command", _fake_trainer("workers_2"))
  out = tmp_path / "out"
  # No plot: CI's test extra has no matplotlib (test_plot_is_written_whole
  # draws one with a failed point, in the slow set).
  code = scaling.main([f"--out={out}", "--replicas=1,2", "--workers=2",
                       "--repeats=2", "--no_plot"])
  captured = capsys.readouterr()
  assert code == 1
  # One start and one end line per run; both failures with code and tail.
  assert captured.out.count(" ...\n") == 6
  assert "[2/6] replicas_2: 1,800 ex/s (900 per replica, efficiency 90%)" in (
      captured.out)
  assert captured.err.count("workers_2: FAILED after") == 2
  assert "exit code 200; last lines of " in captured.err
  assert "    | lost contact with task worker:1" in captured.err
  assert captured.err.rstrip().endswith(
      f"2 run(s) failed: {out}/workers_2/run1, {out}/workers_2/run2")
  report = json.loads((out / "scaling.json").read_text())
  rows = {r["point"]: r for r in report["points"]}
  assert rows["replicas_2"]["scaling_efficiency"] == pytest.approx(0.9)
  assert rows["replicas_2"]["runs_ok"] == 2
  assert rows["workers_2"]["examples_per_sec"] is None
  assert report["failed_runs"] == [f"{out}/workers_2/run1",
                                   f"{out}/workers_2/run2"]
  assert report["host"]["cores"] == scaling.host_cores()
  assert report["command"] == [os.path.join("tools", "scaling.py"),
                               f"--out={out}", "--replicas=1,2",
                               "--workers=2", "--repeats=2", "--no_plot"]
  assert not (out / "scaling.png").exists()
  assert (out / "workers_2" / "run1" / "train.log").exists()
  _, groups = hparams_tab(str(out))
  assert set(groups) == {"replicas_1", "replicas_2"}  # Failures: no metrics.
  assert len(groups["replicas_2"].sessions) == 2  # One per repeat.
  # A second sweep into the same folder is refused: a stale workdir would
  # make its trainer resume instead of train.
  assert scaling.main([f"--out={out}", "--replicas=1"]) == 2


def test_sigterm_stops_the_running_point_and_writes_no_results(
    tmp_path, capsys, monkeypatch):
  started = tmp_path / "started"
  monkeypatch.setattr(scaling, "train_command", lambda *_: [
      sys.executable, "-c", "import os, sys, time\n"
      f"open({str(started)!r}, 'w').write(str(os.getpid()))\n"
      "time.sleep(120)"])
  timer = threading.Timer(0.1, _signal_when_started, (started,))
  timer.start()
  out = tmp_path / "out"
  try:
    code = scaling.main([f"--out={out}", "--replicas=1,2", "--workers=",
                         "--no_plot"])
  finally:
    timer.cancel()
  assert code == 143
  assert "got SIGTERM: the running point was stopped" in (
      capsys.readouterr().err)
  with pytest.raises(ProcessLookupError):  # The run is gone, not orphaned.
    os.kill(int(started.read_text()), 0)
  assert not (out / "scaling.json").exists()
  assert not (out / "replicas_2").exists()  # The sweep went no further.


def _signal_when_started(started, deadline=60.0):
  """SIGTERMs this process once the fake run has written its pid."""
  end = time.monotonic() + deadline
  while not started.exists() and time.monotonic() < end:
    time.sleep(0.05)
  time.sleep(0.2)
  os.kill(os.getpid(), signal.SIGTERM)


# ---- ONE real sweep (slow) ---------------------------------------------------


@pytest.mark.slow
def test_real_sweep_end_to_end(tmp_path):
  """Real training: 1 and 2 replicas in one process, 2 workers on
  127.0.0.1, tiny LSTM runs of 8 steps (about a minute here)."""
  out = tmp_path / "sweep"
  result = helpers.run_module(
      [TOOL, "--replicas=1,2", "--workers=2", "--steps=8",
       "--per_replica_batch=16", f"--out={out}", "--", *TINY], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"host has {scaling.host_cores()} CPU core(s)" in result.stdout
  report = json.loads((out / "scaling.json").read_text())
  rows = {r["point"]: r for r in report["points"]}
  assert list(rows) == ["replicas_1", "replicas_2", "workers_2"]
  for name, replicas, strategy in [
      ("replicas_1", 1, "OneDeviceStrategy"),
      ("replicas_2", 2, "MirroredStrategy"),
      ("workers_2", 2, "MultiWorkerMirroredStrategy")]:
    summary = json.loads((out / name / "summary.json").read_text())
    assert (summary["replicas"], summary["strategy"]) == (replicas, strategy)
    assert summary["global_batch_size"] == 16 * replicas
    assert rows[name]["examples_per_sec"] == summary["examples_per_sec"] > 0
    assert rows[name]["scaling_efficiency"] == pytest.approx(
        summary["examples_per_sec"] / (replicas * rows["replicas_1"][
            "examples_per_sec"]))
    assert (out / name / "train.log").stat().st_size > 0
  assert rows["replicas_2"]["allreduce_ms"] > 0
  assert (out / "scaling.png").stat().st_size > 10_000
  _, groups = hparams_tab(str(out))
  assert set(groups) == set(rows)
  assert _metrics(groups["workers_2"])["scaling/examples_per_sec"] == (
      pytest.approx(rows["workers_2"]["examples_per_sec"]))
  assert _metrics(groups["replicas_1"])["scaling/efficiency"] == 1.0
  assert not subprocess.run(["pgrep", "-f", str(out)], capture_output=True,
                            check=False).stdout  # No worker left behind.
