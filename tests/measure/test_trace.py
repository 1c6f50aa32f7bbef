"""The profiler-trace reader (measure/trace.py) and its CLI.

A real trace is made in a subprocess (tests/scripts/make_trace.py: its own
2-device CPU split and profiler session); hand-built traces pin the arithmetic.
"""
import json
import os
import shutil
import sys

import pytest

import helpers
from dist_keras import tensorboard_events
from dist_keras.measure import trace

STEPS, STRAGGLE_MS = 5, 30.0
CLI = os.path.join("tools", "profile_collectives.py")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
  """(logdir, make_trace's JSON) of 5 profiled steps, replica 1 late 30 ms."""
  logdir = str(tmp_path_factory.mktemp("trace"))
  result = helpers.run_module(
      [os.path.join("tests", "scripts", "make_trace.py"), logdir, f"--steps={STEPS}",
       "--megabytes=4", f"--straggle_ms={STRAGGLE_MS}"], timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  return logdir, json.loads(result.stdout.strip().splitlines()[-1])


def test_the_profiler_writes_one_xplane_file_under_plugins_profile(real):
  logdir, _ = real
  (path,) = trace.find_traces(logdir)
  assert os.path.relpath(path, logdir).split(os.sep)[:2] == [
      "plugins", "profile"]


def test_every_replica_all_reduces_once_per_marked_step(real):
  logdir, made = real
  r = trace.collective_ms_per_step(trace.find_traces(logdir)[0])
  assert r["op_types"].keys() == {"CollectiveReduceV2"}
  assert r["replicas"] == 2 and r["executions"] >= STEPS * 2
  assert r["step_source"] == trace.STEP_MARKERS
  assert r["step_nums"] == made["step_nums"] and r["dropped_steps"] == []
  assert r["total_ms"] > 0
  assert [s["step"] for s in r["by_step"]] == made["step_nums"]
  assert all(s["ms_per_step"] > 0 for s in r["by_step"])
  assert sorted(m["executions"] for m in r["per_replica"].values()) == [
      STEPS, STEPS]


def test_the_early_replica_waits_for_the_straggler_inside_the_collective(real):
  logdir, made = real
  r = trace.collective_ms_per_step(trace.find_traces(logdir)[0],
                                   devices=made["devices"])
  (early,) = [d for d in r["per_replica"] if d.endswith("CPU:0")]
  (late,) = [d for d in r["per_replica"] if d.endswith("CPU:1")]
  # Replica 1 sleeps 30 ms before the all-reduce: replica 0's collective
  # time is mostly waiting for it, replica 1's is not.
  assert r["per_replica"][early]["wait_ms_per_step"] > 0.7 * STRAGGLE_MS
  assert r["per_replica"][late]["wait_ms_per_step"] < 0.3 * STRAGGLE_MS
  assert r["arrival_spread_ms_per_step"] == pytest.approx(
      r["per_replica"][early]["wait_ms_per_step"], rel=0.2)
  assert r["ms_per_step"] == pytest.approx(
      r["wait_ms_per_step"] + r["after_arrival_ms_per_step"])


def test_num_steps_divides_every_complete_all_reduce(real):
  logdir, _ = real
  path = trace.find_traces(logdir)[0]
  r = trace.collective_ms_per_step(path, num_steps=10)
  assert r["step_source"] == trace.GIVEN and r["steps"] == 10
  assert r["ms_per_step"] == pytest.approx(r["total_ms"] / 10 / 2)


def _member(name, start_us, dur_us, step_id, instance):
  return (f"{name}:CollectiveReduceV2", start_us, dur_us,
          {"step_id": step_id, "group_key": 1, "instance_key": instance})


def _made_up_trace(path, function_runs=True):
  """Step 7: a complete all-reduce, member AR 10 us early. Step 8: one member
  only (cut by the profiler). An all-reduce outside both markers."""
  python = [("train", 0, 100, {"step_num": 7}),
            ("train", 100, 100, {"step_num": 8})]
  if function_runs:  # Carry the step_id; time then no longer decides.
    python += [("FunctionRun", 10, 1, {"id": 70}),
               ("FunctionRun", 110, 1, {"id": 80})]
  collective = [_member("AR", 50, 30, 70, 1), _member("AR_1", 60, 20, 70, 1),
                _member("AR", 150, 30, 80, 2),
                _member("AR", 300, 5, 90, 3), _member("AR_1", 300, 5, 90, 3)]
  return helpers.write_xspace(path, {1: python, 2: collective})


@pytest.mark.parametrize("function_runs", [True, False])
def test_made_up_trace_wait_and_steps(tmp_path, function_runs):
  r = trace.collective_ms_per_step(
      _made_up_trace(tmp_path / "t.xplane.pb", function_runs))
  assert (r["replicas"], r["executions"], r["incomplete"]) == (2, 5, 1)
  assert r["step_nums"] == [7] and r["dropped_steps"] == [8]
  assert r["outside_steps"] == 2
  # Step 7: AR waits 10 us then 20 us of reduction, AR_1 20 us of reduction.
  assert r["ms_per_step"] == pytest.approx(0.025)
  assert r["wait_ms_per_step"] == pytest.approx(0.005)
  assert r["after_arrival_ms_per_step"] == pytest.approx(0.020)
  assert r["arrival_spread_ms_per_step"] == pytest.approx(0.010)
  assert r["per_replica"]["AR"]["wait_ms_per_step"] == pytest.approx(0.010)
  assert r["step_ms"] == pytest.approx(0.100)  # Marker 7's wall time.


def test_step_ids_beat_time_when_kernels_outlive_the_marker(tmp_path):
  # The all-reduce of function run 70 starts after marker 7 has ended (as
  # with asynchronous devices): its step_id still puts it in step 7.
  path = helpers.write_xspace(tmp_path / "t.xplane.pb", {
      1: [("train", 0, 40, {"step_num": 7}), ("FunctionRun", 10, 1,
                                               {"id": 70})],
      2: [_member("AR", 50, 30, 70, 1), _member("AR_1", 60, 20, 70, 1)]})
  r = trace.collective_ms_per_step(path)
  assert r["step_nums"] == [7] and r["outside_steps"] == 0
  assert r["ms_per_step"] == pytest.approx(0.025)


def test_without_markers_each_function_run_is_a_step(tmp_path):
  path = helpers.write_xspace(tmp_path / "t.xplane.pb", {
      2: [_member("AR", 0, 4, 70, 1), _member("AR_1", 0, 4, 70, 1),
          _member("AR", 10, 6, 80, 2), _member("AR_1", 10, 6, 80, 2)]})
  r = trace.collective_ms_per_step(path)
  assert (r["step_source"], r["steps"], r["step_nums"]) == (
      trace.FUNCTION_RUNS, 2, None)
  assert r["ms_per_step"] == pytest.approx(0.005)


def test_no_collectives_gives_no_per_step_figures(tmp_path):
  path = helpers.write_xspace(tmp_path / "t.xplane.pb",
                      {1: [("train", 0, 10, {"step_num": 1})]})
  r = trace.collective_ms_per_step(path)
  assert r["executions"] == 0 and r["ms_per_step"] is None


def test_cli_without_a_trace_exits_2_with_one_line(tmp_path):
  result = helpers.run_module([CLI, f"--workdir={tmp_path}"], timeout=120)
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert str(tmp_path) in line
  assert "--config.log.profile_steps=START,STOP" in line


def test_cli_prints_the_trace_beside_the_sync_scalars(real, tmp_path):
  logdir, _ = real
  workdir = str(tmp_path / "run")
  shutil.copytree(logdir, workdir)
  writer = tensorboard_events.Writer(workdir, enabled=True)
  for step in range(1, STEPS + 1):
    writer.scalars(step, {"sync/allreduce_ms": 2.0, "loss": 1.0})
  writer.close()
  result = helpers.run_module([CLI, f"--workdir={workdir}"], timeout=120)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "collective ms per step, mean over replicas" in out
  assert "step markers 1-5" in out and "step wall time" in out
  # The scalar that exists is compared; the one that does not is named.
  assert "sync/allreduce_ms" in out and "2.000" in out
  assert "x the trace's collective ms incl. wait" in out
  assert "sync/straggler_ms  not in this workdir's scalars" in out
  assert "Traceback" not in result.stderr


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
