"""tools/chaos.py and its modules: the plan, the lines read, the faults'
bookkeeping, the report, bad arguments; and one real chaos run (slow).

Everything but the last test runs without TensorFlow or a cluster: the
launcher's lines are fed to chaos_run.Chaos by hand, with a fake injector.
The slow test runs the tool for real: 3 workers, seed 1, one fault of each
kind (~2 minutes here).
"""
import os
import re
import subprocess
import sys

import pytest

import chaos  # tools/, on sys.path (conftest.py)
import chaos_plan
import chaos_report
import chaos_run
import common
import helpers

TOOL = os.path.join(helpers.REPO, "tools", "chaos.py")
# A tiny job whose global batch divides over 3 workers.
TINY = ["--override=train.global_batch_size=48", "--override=model.units=16",
        "--override=data.seq_len=12", "--override=data.train_size=512",
        "--override=data.eval_size=96"]


# ---- the plan ----------------------------------------------------------------


def test_the_plan_is_a_function_of_the_seed():
  assert chaos_plan.make(1, 4, 3, 80, 10) == chaos_plan.make(1, 4, 3, 80, 10)
  plans = {tuple(chaos_plan.make(seed, 4, 3, 80, 10)) for seed in range(20)}
  assert len(plans) > 10


@pytest.mark.parametrize("seed", range(40))
def test_each_fault_falls_after_a_checkpoint_in_its_own_interval(seed):
  plan = chaos_plan.make(seed, 5, 3, 120, 10)
  intervals = [f.step // 10 for f in plan]
  assert intervals == sorted(set(intervals)) and intervals[0] >= 2
  assert all(1 <= f.step % 10 <= 5 for f in plan)  # After the checkpoint.
  assert plan[-1].step <= 120 - 5
  assert all(0 <= f.worker < 3 for f in plan)
  assert {f.kind for f in plan[:4]} == set(chaos_plan.KINDS)  # Dealt rounds.
  for f in plan:
    assert (f.cut in chaos_plan.CUTS and f.file in chaos_plan.FILES) == (
        f.kind == "damage")


def test_the_plan_deals_only_the_kinds_asked_for():
  plan = chaos_plan.make(3, 4, 2, 80, 10, kinds=("kill", "hang"))
  assert sorted(f.kind for f in plan) == ["hang", "hang", "kill", "kill"]


def test_too_few_checkpoint_intervals_for_the_faults():
  with pytest.raises(common.BadInput, match=re.escape(
      "--steps=50 with --checkpoint_every=10 leaves 3 checkpoint interval(s) "
      "for --faults=4 (one each, after the second checkpoint); raise --steps "
      "to at least 60 or lower --checkpoint_every.")):
    chaos_plan.make(1, 4, 3, 50, 10)


def test_the_plan_prints_a_line_per_fault():
  plan = [chaos_plan.Fault(24, "kill", 0),
          chaos_plan.Fault(74, "damage", 2, "truncate", "data")]
  assert chaos_plan.lines(plan) == [
      "  1. step   24  kill    worker 0  SIGKILL",
      "  2. step   74  damage  worker 2  truncate the latest checkpoint's "
      "data file, then SIGKILL"]


# ---- the lines read ----------------------------------------------------------


def test_progress_lines_name_the_step():
  assert chaos_run.progress_step(
      "[w0] step  25/800  loss 1.3864  accuracy 0.2436  (warm-up)\n") == 25
  assert chaos_run.progress_step("[w0] step 800/800  loss 0.0004\n") == 800
  for line in ("[w0] eval at step 100: loss 1.3 (2048 examples)\n",
               "step  25/800  loss 1.3864\n", "[w0] steps 3/4\n"):
    assert chaos_run.progress_step(line) is None


def test_resume_lines_name_the_step_and_the_damage():
  assert chaos_run.resume("[w0] resumed from ckpt-20 at step 20\n") == (
      20, [])
  assert chaos_run.resume(
      "[w0] ckpt-70 is damaged (Read less bytes than requested): resuming "
      "from ckpt-60 at step 60\n") == (60, ["ckpt-70"])
  assert chaos_run.resume("[w0] step  20/80  loss 1.3\n") is None


def test_the_launchers_lines_name_failures_and_restarts():
  assert chaos_run.failure("launch_local: worker 2 exited with code 137; "
                           "stopping the others\n") == (2, 137)
  assert chaos_run.failure("[w1] worker 2 exited with code 137\n") is None
  assert chaos_run.is_restart("launch_local: restart 1/6 after worker 2 "
                              "exited with code 137\n")
  assert not chaos_run.is_restart("[w0] restart 1/6 after\n")


# ---- the faults' bookkeeping -------------------------------------------------


class FakeInjector:
  def __init__(self, fail_on=()):
    self.done, self.released, self.fail_on = [], 0, fail_on

  def inject(self, fault):
    if fault.kind in self.fail_on:
      raise OSError(f"worker {fault.worker} is not running")
    self.done.append(fault)
    return f"{fault.kind} done"

  def release(self):
    self.released += 1


def _chaos(plan, injector=None):
  said = []
  return chaos_run.Chaos(plan, injector or FakeInjector(), (15, 45),
                         said.append), said


def _feed(c, timed_lines):
  for now, line in timed_lines:
    c.feed(line + "\n", now)
    c.tick(now)


def test_a_kill_is_followed_to_the_step_reached_again():
  plan = [chaos_plan.Fault(24, "kill", 0), chaos_plan.Fault(41, "term", 1)]
  c, said = _chaos(plan)
  _feed(c, [(1.0, "[w0] step 23/80  loss 1"), (2.0, "[w0] step 24/80  loss 1"),
            (2.1, "[w0] step 25/80  loss 1"),  # Already printed: counts.
            (3.0, "[w1] dist_keras: error: lost contact with task worker:0"),
            (3.0, "launch_local: worker 0 exited with code 137; stopping "
             "the others"),
            (4.0, "launch_local: restart 1/6 after worker 0 exited with "
             "code 137"),
            (9.0, "[w0] resumed from ckpt-20 at step 20"),
            (10.0, "[w0] step 21/80  loss 1"),
            (12.5, "[w0] step 25/80  loss 1"),
            (13.0, "[w0] step 40/80  loss 1")])
  (outcome,) = c.outcomes
  assert c.injector.done == plan[:1] and c.pending == plan[1:]
  assert (outcome.at_step, outcome.reached, outcome.exit, outcome.resumed,
          outcome.retrained, outcome.restarts) == (24, 25, 137, 20, 5, 1)
  assert outcome.exit_after == 1.0 and outcome.time_lost == 10.5
  assert outcome.survived and c.restarts == 1
  assert outcome.error.startswith("[w1] dist_keras: error: lost contact")
  assert said[0] == "fault 1 at step 24: kill worker 0: kill done"
  assert said[-1] == "  recovered: step 25 reached again 10.5 s after the fault"
  _feed(c, [(14.0, "[w0] step 42/80  loss 1")])  # The next one's turn.
  assert c.injector.done == plan and c.outcomes[1].at_step == 42


def test_a_damage_survives_only_if_the_resume_passed_over_it():
  plan = [chaos_plan.Fault(24, "damage", 1, "truncate", "data")]
  for line, survived in [
      ("[w0] ckpt-20 is damaged (Read less bytes): resuming from ckpt-10 at "
       "step 10", True),
      ("[w0] resumed from ckpt-20 at step 20", False)]:
    c, _ = _chaos(plan)
    _feed(c, [(1.0, "[w0] step 24/80  loss 1"),
              (2.0, "launch_local: worker 1 exited with code 137"),
              (2.0, "launch_local: restart 1/6 after worker 1"),
              (8.0, line), (9.0, "[w0] step 30/80  loss 1")])
    assert c.outcomes[0].survived is survived


def test_a_hang_is_held_past_the_timeout_then_released():
  c, said = _chaos([chaos_plan.Fault(24, "hang", 2)])
  _feed(c, [(100.0, "[w0] step 24/80  loss 1"),
            (107.0, "launch_local: worker 0 exited with code 200")])
  c.tick(114.9)
  assert c.injector.released == 0  # Not before the collective timeout.
  c.tick(115.0)
  assert c.injector.released == 1 and said[-1] == (
      "  SIGCONT after 15.0 s stopped")
  c.tick(200.0)
  assert c.injector.released == 1


def test_a_hang_nobody_noticed_is_released_and_recovers_without_a_restart():
  c, said = _chaos([chaos_plan.Fault(24, "hang", 2)])
  _feed(c, [(100.0, "[w0] step 24/80  loss 1")])
  c.tick(144.0)
  assert c.injector.released == 0
  c.tick(145.0)
  _feed(c, [(146.0, "[w0] step 25/80  loss 1")])
  (outcome,) = c.outcomes
  assert outcome.survived and outcome.restarts == 0 and outcome.exit is None
  assert said[-1] == "  recovered: without a restart 46.0 s after the fault"


def test_a_fault_that_cannot_be_done_is_recorded_and_the_plan_goes_on():
  plan = [chaos_plan.Fault(24, "kill", 0), chaos_plan.Fault(41, "term", 1)]
  c, said = _chaos(plan, FakeInjector(fail_on=("kill",)))
  _feed(c, [(1.0, "[w0] step 24/80  loss 1"), (2.0, "[w0] step 41/80  l")])
  assert [o.injected for o in c.outcomes] == [False, True]
  assert said[0] == ("fault 1 at step 24: kill worker 0: not injected: "
                     "worker 0 is not running")


def test_a_failure_after_no_fault_counts_as_a_restart():
  c, said = _chaos([])
  _feed(c, [(1.0, "launch_local: worker 1 exited with code 200"),
            (2.0, "launch_local: restart 1/2 after worker 1")])
  assert c.restarts == 1 and not c.outcomes
  assert said == ["worker 1 exited with code 200, after no fault of ours"]


# ---- doing the faults --------------------------------------------------------


def _checkpoints(folder, steps):
  folder.mkdir()
  for step in steps:
    (folder / f"ckpt-{step}.index").write_bytes(bytes(range(200)))
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(
        bytes(range(256)) * 4)
  return folder


def test_damage_cuts_or_overwrites_the_newest_checkpoint(tmp_path):
  folder = _checkpoints(tmp_path / "checkpoints", [10, 20])
  said = chaos_run.damage_latest(str(folder), "truncate", "data")
  assert said == "ckpt-20.data-00000-of-00001 cut from 1024 to 512 bytes"
  assert (folder / "ckpt-20.data-00000-of-00001").stat().st_size == 512
  said = chaos_run.damage_latest(str(folder), "overwrite", "index")
  assert said == "ckpt-20.index: 64 bytes at 68 of 200 inverted"
  damaged = (folder / "ckpt-20.index").read_bytes()
  assert damaged[68:132] == bytes(255 - b for b in range(68, 132))
  assert damaged[:68] + damaged[132:] == bytes(range(68)) + bytes(
      range(132, 200))
  assert (folder / "ckpt-10.index").read_bytes() == bytes(range(200))
  with pytest.raises(OSError, match="no checkpoint in .* to damage"):
    chaos_run.damage_latest(str(tmp_path), "truncate", "data")


def test_workers_are_found_by_their_tf_config_task():
  env = dict(os.environ, TF_CONFIG='{"task": {"type": "worker", "index": 2}}')
  child = subprocess.Popen([sys.executable, "-c", "import time; "
                            "print('up', flush=True); time.sleep(30)"],
                           env=env, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == "up\n"  # Its own environment now.
    assert chaos_run.worker_pids(os.getpid()) == {2: child.pid}
  finally:
    child.kill()
    child.wait()
  assert chaos_run.worker_pids(os.getpid()) == {}


# ---- the report --------------------------------------------------------------


def _outcome(fault, **fields):
  return chaos_run.Outcome(fault, fault.step, 0.0, **fields)


def test_the_report_is_a_table_and_totals():
  outcomes = [
      _outcome(chaos_plan.Fault(24, "kill", 0), reached=25, exit=137,
               exit_after=0.1, restarts=1, resumed=20, recovered_at=11.2),
      _outcome(chaos_plan.Fault(74, "damage", 2, "truncate", "data"),
               reached=74, exit=137, exit_after=0.1, restarts=1, resumed=60,
               damaged=("ckpt-70",), recovered_at=16.1),
      _outcome(chaos_plan.Fault(78, "term", 1), injected=False,
               done="not injected: worker 1 is not running")]
  assert chaos_report.table(outcomes) == [
      "fault   worker  at step  exit  exit after s  restarts  resumed from"
      "          retrained  time lost s",
      "kill         0       24   137           0.1         1  20          "
      "                  5         11.2",
      "damage       2       74   137           0.1         1  60 (ckpt-70 "
      "damaged)         14         16.1",
      "term         1       78     -             -         0  -           "
      "                  -            -",
      "fault 3: not injected: worker 1 is not running",
  ]
  result = chaos_run.Result(0, 84.3, chaos_run.Chaos([], None, (15, 45)))
  result.chaos.outcomes, result.chaos.restarts = outcomes, 3
  assert chaos_report.totals(result, 21.3, 3, "max|diff| 0") == [
      "faults planned 3, injected 2, survived 2; restarts 3 (1 after no "
      "fault of ours); steps retrained 19",
      "wall time 84.3 s vs 21.3 s uninterrupted: +63.0 s (31.5 s a fault)",
      "final weights: max|diff| 0"]


# ---- arguments ---------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["--faults=0"], "--faults=0 must be >= 1."),
    (["--num_workers=1"], "--num_workers=1 must be >= 2."),
    (["--checkpoint_every=1"], "--checkpoint_every=1 must be >= 2."),
    (["--collective_timeout=0"], "--collective_timeout=0.0 must be >= 1."),
    (["--kinds=kill,melt"], "--kinds='kill,melt' must be comma-separated "
     "kinds of kill, term, hang, damage."),
    (["--steps=40"], "--steps=40 with --checkpoint_every=10 leaves 2 "
     "checkpoint interval(s) for --faults=4"),
    (["--override=train.steps=5"], "--override=train.steps=5: the tool sets "
     "train.steps for each run; use --steps instead."),
    (["--override=train.log_every=5"], "--override=train.log_every=5: the "
     "tool sets train.log_every for each run."),
    (["--override=model.unitz=3"], "--override=model.unitz names no config "
     "key (did you mean 'units'?)"),
    (["--faults=x"], "argument --faults: invalid int value: 'x'; see --help."),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, tmp_path,
                                               capsys):
  args = [f"--workdir={tmp_path}/new", *TINY, *argv]
  assert chaos.main(args) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("chaos: error: ") and message in line, line
  assert not os.path.exists(tmp_path / "new")


def test_a_batch_the_workers_cannot_share_names_one_that_they_can(capsys):
  assert chaos.main(["--workdir=/nonexistent/x"]) == 2
  assert capsys.readouterr().err == (
      "chaos: error: train.global_batch_size=256 is not divisible by the 3 "
      "workers; pass --override=train.global_batch_size=255.\n")


def test_a_workdir_with_runs_in_it_is_refused(tmp_path, capsys):
  (tmp_path / "chaos").mkdir()
  assert chaos.main([f"--workdir={tmp_path}", *TINY]) == 2
  assert "--workdir=" in capsys.readouterr().err


def test_the_command_sets_the_tools_keys_after_the_users():
  args = chaos.parser().parse_args(["--workdir=w", *TINY])
  command = chaos.command(args, "/w/chaos")
  assert command[1:5] == ["-m", "dist_keras.train", "--config=lstm_longmem",
                          "--workdir=/w/chaos"]
  assert command[-6:] == [
      "--config.train.steps=80", "--config.train.checkpoint_every=10",
      "--config.train.log_every=1", "--config.log.progress=true",
      "--config.runtime.timeout_seconds=15.0",
      "--config.log.calibration_steps=0"]


# ---- one real chaos run ------------------------------------------------------


@pytest.mark.slow
def test_a_real_chaos_run_survives_one_fault_of_each_kind(tmp_path):
  result = subprocess.run(
      [sys.executable, TOOL, "--seed=1", "--faults=4", "--num_workers=3",
       f"--workdir={tmp_path}/chaos", *TINY],
      capture_output=True, text=True, timeout=900, check=False,
      cwd=helpers.REPO)
  out = result.stdout
  assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
  assert out.startswith("chaos: seed 1, 4 fault(s) into 3 workers")
  assert "faults planned 4, injected 4, survived 4; restarts 4;" in out
  assert ("final weights: max|diff| 0 over 6 model.keras weights, 0 over 22 "
          "final checkpoint tensors (optimizer state included): bitwise "
          "equal") in out
  rows = out[out.index("fault   worker"):].splitlines()[1:5]
  assert sorted(row.split()[0] for row in rows) == sorted(chaos_plan.KINDS)
  exits = {row.split()[0]: int(row.split()[3]) for row in rows}
  # The launcher reports the first failed worker it sees: the killed one
  # (137), or a peer that lost it (200) if both ended between two looks.
  assert exits["term"] == 143 and exits["hang"] == 200
  assert {exits["kill"], exits["damage"]} <= {137, 200}
  assert re.search(r"ckpt-\d+ damaged", out)
