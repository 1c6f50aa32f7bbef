"""Progress between log lines (actions.Progress): each call that traced a
step function is reported, and a heartbeat comes when log.progress_seconds
pass without a line; with a fake clock, no TensorFlow. And the run's last
lines (report.footer)."""
import os
import shlex
import sys

import pytest

from dist_keras.training import actions, report
from dist_keras.training.settings import Schedule


class _Trainer:
  def __init__(self):
    self.said = []

  def say(self, line):
    self.said.append(line)


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _progress(monkeypatch, every_seconds=30):
  """A Progress over a 100-step run logging every 50 steps; returns what
  it said, `call(steps, seconds, traced=None)` that runs one call, and the
  run's state."""
  clock = _Clock()
  monkeypatch.setattr(actions.time, "monotonic", clock)
  run = actions.RunState(Schedule(100, 50, 1000, 0), step=0)
  trainer = _Trainer()
  action = actions.Progress(run, trainer, every_seconds)

  def call(steps, seconds, traced=None):
    action.on_train_batch_begin(0)
    clock.now += seconds
    run.step += steps
    run.out = {"traced": traced} if traced else {}
    action.on_train_batch_end(0)

  return trainer.said, call, run


@pytest.fixture
def progress(monkeypatch):
  return _progress(monkeypatch)


def test_each_call_that_traced_is_reported_with_its_seconds(progress):
  said, call, run = progress
  call(1, 41.25, "timed")
  call(1, 38.0, "plain")
  call(5, 2.0)
  assert said == [
      ("step 1 in 41.2 s: traced and compiled the timed step function "
       "(logged steps run it)"),
      ("step 2 in 38.0 s: traced and compiled the plain step function "
       "(the untimed steps run it)")]
  assert run.tracing_seconds == pytest.approx(79.25)


def test_a_heartbeat_when_no_line_for_the_interval(progress):
  said, call, _ = progress
  call(1, 40.0, "timed")
  call(1, 40.0, "plain")  # Traced: its line resets the interval.
  for _ in range(7):
    call(1, 5.0)  # Steps 3-9; step 8 ends 30 s after step 2's line.
  assert said[2:] == ["step   8/100  5.00 s/step  ETA 0:07:40"]
  call(1, 0.5)
  assert len(said) == 3  # The interval starts again from the heartbeat.


def test_no_heartbeat_at_log_steps(progress):
  said, call, _ = progress
  call(1, 1.0, "timed")
  call(49, 60.0)  # Ends at step 50, a log step: LogWindow says the line.
  assert len(said) == 1
  call(1, 31.0)  # 31 s after step 50's line; 91 s for 50 steps since step 1.
  assert said[-1] == "step  51/100  1.82 s/step  ETA 0:01:29"


def test_zero_seconds_means_no_heartbeat(monkeypatch):
  said, call, _ = _progress(monkeypatch, every_seconds=0)
  call(1, 1.0, "timed")
  call(10, 1000.0)
  assert len(said) == 1


def test_the_rate_is_in_milliseconds_below_a_second(progress):
  said, call, _ = progress
  call(1, 1.0, "timed")
  for _ in range(40):
    call(1, 0.8)
  assert said[-1] == "step  39/100  800 ms/step  ETA 0:00:48"


def _summary(steps):
  return {"steps": steps, "eval_accuracy": 0.5, "eval_loss": 1.25}


def _tensorboard_at(monkeypatch, tmp_path, on_path: bool, beside: bool):
  """PATH and sys.executable's folder, each with a `tensorboard` script or
  not; returns the folder's script path."""
  path, venv = tmp_path / "path", tmp_path / "venv"
  for folder, has in ((path, on_path), (venv, beside)):
    folder.mkdir()
    if has:
      (folder / "tensorboard").write_text("#!/bin/sh\n")
      (folder / "tensorboard").chmod(0o755)
  monkeypatch.setenv("PATH", str(path))
  monkeypatch.setattr(sys, "executable", str(venv / "python"))
  return str(venv / "tensorboard")


@pytest.fixture(name="tensorboard_on_path")
def _tensorboard_on_path(monkeypatch, tmp_path_factory):
  _tensorboard_at(monkeypatch, tmp_path_factory.mktemp("bin"), True, False)


@pytest.mark.parametrize("writing,events,shown", [
    (True, False, True), (False, True, True), (False, False, False)])
def test_the_tensorboard_line_is_there_when_there_is_something_to_show(
    tmp_path, writing, events, shown, tensorboard_on_path):
  """With log.tensorboard off and no event files from an earlier run the
  line pointed at nothing (and said so twice)."""
  if events:
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
  footer = report.footer(_summary(8), str(tmp_path), writing)
  assert footer.splitlines()[0].startswith("done: 8 steps, eval accuracy")
  assert (f"\nTensorBoard: tensorboard --logdir {tmp_path}" in footer) == (
      shown)


def test_the_tensorboard_command_can_be_pasted_into_a_shell(
    tmp_path, tensorboard_on_path):
  workdir = str(tmp_path / "my run's folder")
  assert report.tensorboard_line(workdir, True) == (
      "\nTensorBoard: tensorboard --logdir "
      f"{shlex.quote(workdir)}")
  assert shlex.split(report.tensorboard_line(workdir, True))[-1] == workdir


def test_a_venv_not_activated_gets_the_tensorboard_beside_its_python(
    monkeypatch, tmp_path):
  """The README's quick start runs .venv/bin/python, never activated: the
  line's bare `tensorboard` was 'command not found' in that shell."""
  script = _tensorboard_at(monkeypatch, tmp_path, False, True)
  line = report.tensorboard_line("/tmp/run", True)
  assert line == f"\nTensorBoard: {script} --logdir /tmp/run"
  assert os.access(shlex.split(line)[1], os.X_OK)


@pytest.mark.parametrize("activated", [False, True])
def test_a_launchers_worker_names_the_tensorboard_of_the_users_shell(
    monkeypatch, tmp_path, activated):
  """The launcher puts its Python's folder first on its workers' PATH, not
  on the user's: a worker whose PATH finds only the script beside its
  Python names that script's path, unless a venv is activated."""
  script = _tensorboard_at(monkeypatch, tmp_path, False, True)
  monkeypatch.setenv("PATH", os.path.dirname(script))
  if activated:
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
  else:
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
  assert report.tensorboard_command() == (
      "tensorboard" if activated else script)


def test_no_tensorboard_at_all_says_how_to_install_it(monkeypatch, tmp_path):
  _tensorboard_at(monkeypatch, tmp_path, False, False)
  python = str(tmp_path / "venv" / "python")
  assert report.tensorboard_line("/tmp/run", True) == (
      f"\nTensorBoard: not installed for this Python; {python} -m pip "
      f"install tensorboard, then {python} -m tensorboard.main --logdir "
      "/tmp/run")


def test_the_done_line_counts_one_step_as_one():
  assert report.done_line(_summary(1)).startswith("done: 1 step, eval ")
  assert report.done_line(_summary(2)).startswith("done: 2 steps, eval ")


def test_the_eval_line_counts_one_example_as_one():
  one = report.eval_line(4, {"loss": 0.5, "examples": 1}, 0.25, False)
  assert one.endswith("(1 example in 0.2 s)"), one
  two = report.eval_line(4, {"loss": 0.5, "examples": 2}, 0.25, True)
  assert "(2 examples in 0.2 s: traced and compiled" in two, two
