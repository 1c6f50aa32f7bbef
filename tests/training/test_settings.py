"""training/settings.py: what the loop reads of a config, and its Schedule."""
import helpers
from dist_keras.training.settings import (AUTO_CALL_SECONDS, Schedule,
                                          Settings, auto_steps_per_call)


def _schedule(**kw):
  args = {"steps": 100, "log_every": 10, "checkpoint_every": 25,
          "eval_every": 50}
  return Schedule(**{**args, **kw})


def test_logs_evals_and_checkpoints_fall_on_their_multiples():
  s = _schedule()
  assert [t for t in range(1, 101) if s.logs(t)] == list(range(10, 101, 10))
  # An epoch (eval.every steps, or the whole run) ends with an eval; the
  # final checkpoint is saved where training ends, not from the schedule.
  assert [t for t in range(1, 101) if s.ends_epoch(t)] == [50, 100]
  assert [t for t in range(1, 101) if s.checkpoints(t)] == [25, 50, 75]
  assert [t for t in range(1, 101)
          if _schedule(eval_every=0).ends_epoch(t)] == [100]
  assert _schedule(steps=95).logs(95)  # The last step always logs.


def test_epochs_are_eval_intervals():
  s = _schedule(steps=120)
  assert (s.epoch_steps, s.epochs) == (50, 3)
  assert [s.epoch_after(t) for t in (0, 49, 50, 100)] == [0, 0, 1, 2]
  assert [s.epoch_end(e) for e in range(3)] == [50, 100, 120]
  assert _schedule(eval_every=0).epochs == 1


def test_timed_steps_are_the_logged_ones_and_step_one():
  s = _schedule()
  assert [t for t in range(1, 101) if s.timed(t)] == [1, *range(10, 101, 10)]
  assert not any(_schedule(sync_timing=False).timed(t) for t in range(1, 101))


def test_a_resumed_process_warms_its_timed_step_up_with_its_first_step():
  """Resumed after step 35: step 36 runs the timed function (its trace
  discarded), so step 40's breakdown is kept; resumed after 39, the first
  step is a logged one anyway."""
  s = _schedule()
  assert [t for t in range(36, 61) if s.timed(t, first=36)] == [36, 40, 50, 60]
  assert [t for t in range(40, 61) if s.timed(t, first=40)] == [40, 50, 60]
  assert not _schedule(sync_timing=False).timed(36, first=36)


def test_a_call_never_runs_past_a_step_the_host_must_see():
  s = _schedule(steps_per_loop=8, sync_timing=False)
  step, calls = 0, []
  while step < s.steps:
    n = s.call_size(step)
    calls.append((step + 1, step + n))
    step += n
  ends = {end for _, end in calls}
  assert {10, 20, 25, 30, 50, 75, 100} <= ends  # Logs, checkpoints, eval.
  assert max(end - start + 1 for start, end in calls) == 8
  assert calls[0] == (1, 8)


def test_a_call_stops_before_a_timed_step():
  # The loop runs a timed step alone (step 1, 10, 20, ...); call_size is
  # asked for the plain steps between them.
  s = _schedule(steps_per_loop=8)
  assert s.call_size(1) == 8  # Steps 2-9: step 10 is timed.
  assert s.call_size(9) == 1  # Nothing fits before step 10.
  assert s.call_size(10) == 8 and s.call_size(18) == 1


def test_automatic_steps_per_call_take_the_loops_limit():
  s = _schedule(steps_per_loop=0, sync_timing=False)
  assert s.call_size(0) == 1  # No limit known yet: one step per call.
  assert s.call_size(0, auto_limit=4) == 4
  assert s.call_size(0, auto_limit=1000) == 10  # Up to the log at step 10.
  assert _schedule(steps_per_loop=3).call_size(0, auto_limit=8) == 3


def test_automatic_calls_last_about_a_second_on_one_host():
  assert auto_steps_per_call(None, multi_worker=False) == 1
  assert auto_steps_per_call(AUTO_CALL_SECONDS / 50, False) == 50
  assert auto_steps_per_call(3 * AUTO_CALL_SECONDS, False) == 1
  # Workers must group steps alike: no timing enters their calls.
  assert auto_steps_per_call(None, True) == auto_steps_per_call(9.0, True)
  assert auto_steps_per_call(None, True) > 10**6


def test_profiled_steps_run_one_per_call():
  s = _schedule(steps_per_loop=8, sync_timing=False, profile=(5, 7))
  assert s.call_size(0) == 4  # Up to the step before the trace starts.
  assert [s.call_size(t) for t in range(4, 9)] == [1] * 5  # 5..9 (stop + 2).
  assert s.call_size(10) == 8


def test_settings_read_the_config_once_and_turn_timing_off_on_tpu():
  c = helpers.tiny_config()
  c.log.profile_steps, c.log.sync_timing = "3,4", True
  s = Settings.from_config(c, on_tpu=False)
  assert s.schedule.profile == (3, 4) and s.schedule.sync_timing
  assert s.schedule.steps == c.train.steps
  assert s.step_options == {"jit_compile": False, "allreduce_dtype": "float32",
                            "bytes_per_pack": 0}
  tpu = Settings.from_config(c, on_tpu=True)
  assert not tpu.schedule.sync_timing and tpu.calibration_steps == 0
