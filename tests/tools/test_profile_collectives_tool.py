"""tools/profile_collectives.py leaves the sync timing's own all_gather out.

The reader's arithmetic and the CLI on a real trace: tests/measure/test_trace.py.
"""
import json
import os

import pytest

import helpers
import profile_collectives  # tools/, on sys.path (conftest.py)
from dist_keras import tensorboard_events


def _execution(node, op_type, start_us, dur_us, instance):
  return (f"{node}:{op_type}", start_us, dur_us,
          {"step_id": 70, "group_key": 1, "instance_key": instance})


def _workdir(tmp_path) -> str:
  """A run's workdir whose trace holds one marked step: the gradients'
  all-reduce, an Embedding's slices gathered (2 members each, 58 us in
  all) and the stamps' all_gather after them (2 members, 10 us)."""
  folder = tmp_path / "plugins" / "profile" / "2026_12_05_12_00_00"
  os.makedirs(folder)
  helpers.write_xspace(folder / "host.xplane.pb", {
      1: [("train", 0, 200, {"step_num": 7}),
          ("FunctionRun", 10, 1, {"id": 70})],
      2: [_execution("CollectiveReduceV2", "CollectiveReduceV2", 50, 30, 1),
          _execution("CollectiveReduceV2_1", "CollectiveReduceV2", 60, 20,
                     1),
          _execution("cond/then/_4/cond/CollectiveGatherV2",
                     "CollectiveGatherV2", 85, 4, 2),
          _execution("cond/then/_4/cond/CollectiveGatherV2_1",
                     "CollectiveGatherV2", 85, 4, 2),
          _execution("allgather/CollectiveGatherV2", "CollectiveGatherV2",
                     100, 6, 3),
          _execution("allgather/CollectiveGatherV2_1", "CollectiveGatherV2",
                     102, 4, 3)]})
  return str(tmp_path)


@pytest.mark.parametrize("name,stamps", [
    ("allgather/CollectiveGatherV2_3:CollectiveGatherV2", True),
    ("step/allgather/CollectiveGatherV2:CollectiveGatherV2", True),
    ("allgather/Pad_1:Pad", False),  # Not a collective.
    ("CollectiveGatherV2:CollectiveGatherV2", False),  # Slices' counts.
    ("cond/then/_472/cond/CollectiveGatherV2:CollectiveGatherV2", False),
    ("CollectiveReduceV2_1:CollectiveReduceV2", False)])
def test_only_the_all_gather_scope_is_the_stamps(name, stamps):
  assert profile_collectives.is_stamps_gather(name) is stamps


def test_the_stamps_gather_is_left_out_and_counted(tmp_path, capsys):
  workdir = _workdir(tmp_path)
  assert profile_collectives.main([f"--workdir={workdir}", "--json"]) == 0
  (r,) = json.loads(capsys.readouterr().out)
  assert r["op_types"] == {"CollectiveReduceV2": 2, "CollectiveGatherV2": 2}
  assert r["stamps_gathers_left_out"] == {"CollectiveGatherV2": 2}
  # (30 + 20 + 4 + 4) us over 2 replicas in 1 step: the stamps' 10 us not.
  assert r["ms_per_step"] == pytest.approx(0.029)
  assert r["trace"].startswith(workdir)


def test_the_note_says_what_was_left_out(tmp_path, capsys):
  assert profile_collectives.main([f"--workdir={_workdir(tmp_path)}"]) == 0
  out = capsys.readouterr().out
  assert "2 CollectiveGatherV2, 2 CollectiveReduceV2; 1 steps" in out
  assert ("note: 2 CollectiveGatherV2 of the sync timing's own all_gather "
          "(nodes under allgather/") in out


def _with_scalars(workdir: str, replicas: int) -> str:
  """`workdir` with the sync scalars of its marked step 7 and a
  summary.json of a job of `replicas` replicas."""
  writer = tensorboard_events.Writer(workdir, enabled=True)
  writer.scalars(7, {"sync/allreduce_ms": 0.02, "sync/straggler_ms": 0.01})
  writer.close()
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"replicas": replicas}, f)
  return workdir


def test_one_host_compares_the_straggler_wait_with_its_trace(tmp_path,
                                                             capsys):
  workdir = _with_scalars(_workdir(tmp_path), replicas=2)
  assert profile_collectives.main([f"--workdir={workdir}"]) == 0
  out = capsys.readouterr().out
  assert "x the trace's mean wait" in out
  assert "of the job's" not in out and "not compared" not in out


def test_under_multi_worker_the_jobs_straggler_wait_is_not_compared(
    tmp_path, capsys):
  """The chief's trace holds its own 2 replicas; sync/straggler_ms is the
  mean over the job's 4: shown, not set against this trace's wait."""
  workdir = _with_scalars(_workdir(tmp_path), replicas=4)
  assert profile_collectives.main([f"--workdir={workdir}"]) == 0
  out = capsys.readouterr().out
  assert "note: this trace holds 2 of the job's 4 replicas" in out
  straggler = out[out.index("sync/straggler_ms"):]
  assert "not compared: the job's, over its 4 replicas" in straggler
  assert "x the trace's" not in straggler
  assert "x the trace's after-arrival ms" in out  # sync/allreduce_ms's.


def test_without_a_summary_the_replica_tags_count_the_jobs_replicas(
    tmp_path):
  scalars = {f"sync_replica/{i}/compute_ms": [(7, 1.0)] for i in range(4)}
  assert profile_collectives.job_replicas(str(tmp_path), scalars) == 4
  assert profile_collectives.job_replicas(str(tmp_path), {}) is None
