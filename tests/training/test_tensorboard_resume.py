"""What TensorBoard shows of a run over its life (docs/outputs.md): each
segment's config at the step it started from, the peak perf/mfu divides by,
the tags a rerun no longer writes, and the way the page tells scripts to
read the event files."""
import io
import json
import os
import re
import time
import types
from contextlib import redirect_stdout

import pytest
from tensorboard.backend.event_processing import event_accumulator

import helpers
from dist_keras import tensorboard_events


@pytest.fixture(scope="module")
def rerun(tmp_path_factory, mirrored):
  """The tiny run with the sync breakdown on (checkpoints at 4 and 8), as
  if killed after its step-4 checkpoint, rerun with log.sync_timing off:
  a resume that changed a key and what is logged. Its workdir, and the
  first run's scalars and summary.json."""
  workdir = tmp_path_factory.mktemp("rerun")
  c = helpers.tiny_config()
  c.log.sync_timing = True
  summary = helpers.train(c, str(workdir), mirrored)
  first = helpers.scalar_tags(str(workdir))
  helpers.as_if_killed_after(str(workdir), kept=4, last=8)
  assert helpers.train(helpers.tiny_config(), str(workdir),
                       mirrored)["steps"] == 8
  return types.SimpleNamespace(workdir=str(workdir), first=first,
                               summary=summary)


def _sync_timing(text: str) -> bool:
  return json.loads(text.strip("`\n"))["log"]["sync_timing"]


def test_each_segments_config_stays_at_the_step_it_started_from(rerun):
  """Both at step 0, the Rust loader kept the rerun's config alone and the
  Python one showed two configs at step 0, not told apart."""
  for texts in (helpers.config_texts(rerun.workdir),
                helpers.served_texts(rerun.workdir)["config"]):
    assert [step for step, _ in texts] == [0, 4]
    assert [_sync_timing(text) for _, text in texts] == [True, False]


def test_perf_peak_tflops_is_the_peak_perf_mfu_divides_by(rerun):
  """A measured peak is each process's own: this tag shows why perf/mfu
  moves at a resume where perf/examples_per_sec does not."""
  tags, devices = rerun.first, rerun.summary["peak_devices"]
  steps = [step for step, _ in tags["perf/mfu"]]
  assert steps == [8]
  assert [step for step, _ in tags["perf/peak_tflops"]] == steps
  for (_, mfu), (_, peak), (_, achieved) in zip(
      tags["perf/mfu"], tags["perf/peak_tflops"], tags["perf/model_tflops"]):
    assert peak > 0
    assert mfu == pytest.approx(achieved / (peak * devices), rel=1e-5)


def test_a_tag_the_rerun_no_longer_writes_keeps_the_killed_runs_points(
    rerun):
  """As docs/outputs.md says: the Rust loader keeps the killed process's
  sync/* point past the checkpoint (step 8), the Python loader drops it."""
  assert [s for s, _ in helpers.served_scalars(rerun.workdir)[
      "sync/step_ms"]] == [4, 8]
  assert [s for s, _ in helpers.scalar_tags(rerun.workdir)[
      "sync/step_ms"]] == [4]


def _resumed_logdir(logdir: str) -> None:
  """Steps 1-6 logged, then a rerun from the step-4 checkpoint logs 5-8
  (+100). Each writer in its own second: TensorBoard orders a folder's
  event files by name, the second first."""
  for resumed_at, steps, offset in ((0, range(1, 7), 0.0),
                                    (4, range(5, 9), 100.0)):
    second = int(time.time())
    while int(time.time()) == second:
      time.sleep(0.01)
    writer = tensorboard_events.Writer(logdir, enabled=True)
    writer.start(resumed_at)
    for step in steps:
      writer.scalars(step, {"loss": offset + step})
    writer.close()


def _page_blocks() -> list[str]:
  """The Python blocks of docs/outputs.md's section on reading the event
  files from a script."""
  with open(os.path.join(helpers.REPO, "docs", "outputs.md"),
            encoding="utf-8") as f:
    section = f.read().split("### Reading the event files from a script\n")
  assert len(section) == 2, "docs/outputs.md lost its section"
  section = re.split(r"\n#{1,3} ", section[1], maxsplit=1)[0]
  return re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)


def test_the_pages_way_to_read_scalars_shows_a_resumed_run_once(tmp_path):
  """Each of the page's blocks, run as printed on a resumed run's folder,
  shows steps 1-8 once, the rerun's from 5; the legacy loader the page
  warns of shows the zig-zag."""
  logdir = str(tmp_path)
  _resumed_logdir(logdir)
  blocks = _page_blocks()
  assert len(blocks) == 2
  rerun = [(s, s + (100.0 if s > 4 else 0.0)) for s in range(1, 9)]
  for block in blocks:
    assert "runs/my_run" in block
    printed = io.StringIO()
    with redirect_stdout(printed):
      exec(block.replace("runs/my_run", logdir), {})  # pylint: disable=exec-used
    shown = [tuple(map(float, line.split())) for line in
             printed.getvalue().splitlines()]
    assert shown == rerun, block
  legacy = event_accumulator.EventAccumulator(
      logdir, size_guidance={event_accumulator.TENSORS: 0})
  legacy.Reload()
  assert [e.step for e in legacy.Tensors("loss")] == [1, 2, 3, 4, 5, 6,
                                                      5, 6, 7, 8]
