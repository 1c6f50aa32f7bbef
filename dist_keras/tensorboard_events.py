"""TensorBoard event files: written by the chief only, read back by tools.

Every other worker gets a no-op writer, so callers never branch on the role.
A writer writes into its own logdir alone, whatever a user's
keras.callbacks.TensorBoard with batch summaries (update_freq="batch" or a
number) set between its hooks: its writer as the default, and recording
only every update_freq-th batch (`_own`).

A resumed run logs again the steps its killed predecessor logged past its
last checkpoint. TensorBoard's default loader (the Rust data server) keeps
one point per step on its own: a point at step s drops the points of its tag
at s and after (tensorboard/data/server/reservoir.rs, `preempt`); it reads
no SessionLog. Its Python loader (--load_fast=false) drops them only on a
SessionLog START after the first one of the logdir, so every run begins
with one (`Writer.start`).

The events file is opened with the run's first point: what a run writes
before it (that START, the config text, the layout) waits for it. A rerun
of a finished workdir, which trains nothing, and a run that fails before
its first point (at step 1) write no file: TensorBoard would list such a
file's run with the config text alone, and nothing half-written is kept.
(Keras' TensorBoard callback opens its file when fit begins and writes the
model's summary there, so a fit that fails at step 1 leaves one.)
"""
import contextlib
import json
import time

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar
from tensorboard.util import tensor_util


class Writer:
  """Scalars and text for TensorBoard, in `logdir`, on the chief only."""

  def __init__(self, logdir: str, enabled: bool):
    self.logdir = logdir
    self.enabled = enabled
    self._writer = None  # Opened with the first point (_opened).
    self._before_first_point = []  # Writes waiting for it, in order.

  def _opened(self):
    """The events file's writer, opened now if it is not yet, with what
    the run wrote before its first point."""
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(self.logdir)
      waiting, self._before_first_point = self._before_first_point, []
      for write in waiting:
        write()
    return self._writer

  def start(self, resumed_at: int) -> None:
    """A SessionLog START at `resumed_at` + 1, before any of this run's
    points (`resumed_at`: the checkpoint's step, 0 for a new run): the
    points an earlier run logged from there on are superseded, and
    TensorBoard's Python loader drops them (its first START only arms it,
    hence one in every run). The point at `resumed_at` itself stands: the
    rerun does not log it again."""
    if not self.enabled:
      return
    event = tf.compat.v1.Event(
        step=resumed_at + 1, wall_time=time.time(),
        session_log=tf.compat.v1.SessionLog(
            status=tf.compat.v1.SessionLog.START))
    # TensorFlow 2's writers have no public call for an Event of this kind;
    # the op that writes one takes the writer's resource.
    self._before_first_point.append(lambda: tf.raw_ops.ImportEvent(
        writer=self._writer._resource,  # pylint: disable=protected-access
        event=event.SerializeToString()))

  def scalars(self, step: int, values: dict) -> None:
    """Writes each `name: value` at `step` (None values are skipped); an
    array (a metric of a value per class) as one scalar per element,
    `name/0`, `name/1`, ... (`name/0_1` for a matrix's), grouped under
    `name` in TensorBoard."""
    values = {k: v for k, v in values.items() if v is not None}
    if not (self.enabled and values):
      return
    with self._own(step):
      for name, value in values.items():
        if np.ndim(value) == 0:
          tf.summary.scalar(name, value)
          continue
        for index, element in np.ndenumerate(np.asarray(value)):
          tf.summary.scalar(f"{name}/{'_'.join(map(str, index))}", element)

  def config(self, config_dict: dict, step: int) -> None:
    """The resolved config as pretty JSON in the Text tab, at `step`: the
    step the run starts from (the resumed checkpoint's, 0 for a new run).
    Each segment's config stays, told apart by its step: at one shared
    step the Rust loader keeps only the last (a point drops its tag's
    points at its step and after) and the Python one shows all alike.
    Written after `start`, whose marker at `step` + 1 purges nothing
    at `step`."""
    text = "```\n" + json.dumps(config_dict, indent=2, sort_keys=True) + "\n```"

    def write():
      with self._own(step):
        tf.summary.text("config", text)
    if self.enabled:
      self._before_first_point.append(write)

  def sync_layout(self) -> None:
    """A Custom Scalars layout that draws the step breakdown as one chart."""
    if not self.enabled:
      return

    def chart(title, regex):
      return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=[regex]))
    layout = layout_pb2.Layout(category=[layout_pb2.Category(
        title="sync: where a step's time goes",
        chart=[
            chart("step breakdown (ms, mean over replicas)",
                  r"^sync/(input_wait|compute|straggler|allreduce|step"
                  r"|outside)_ms$"),
            chart("synchronisation share of the step", r"^sync/fraction$"),
            chart("compute per replica (ms)", r"^sync_replica/.*/compute_ms$"),
            chart("input wait per replica (ms)",
                  r"^sync_replica/.*/input_wait_ms$"),
            chart("throughput (examples/s)", r"^perf/examples_per_sec"),
        ])])

    def write():
      with self._own(0):
        tf.summary.experimental.write_raw_pb(
            custom_scalar.pb(layout).SerializeToString(), step=0)
    self._before_first_point.append(write)

  @contextlib.contextmanager
  def _own(self, step: int):
    """This writer as the default, recording, whatever a user's
    TensorBoard set; the events file opened if it is not yet. Only for an
    enabled one (a disabled Writer writes nothing, so nothing it writes
    can reach a user's TensorBoard's default writer)."""
    with self._opened().as_default(step=step), tf.summary.record_if(True):
      yield

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every scalar summary in `logdir`.

  For tools and tests: reads the event files back as TensorBoard's Python
  loader does (points a resumed run superseded are dropped).
  """
  acc = plugin_event_accumulator.EventAccumulator(
      logdir, size_guidance={plugin_event_accumulator.TENSORS: 0})
  acc.Reload()
  scalars = {}
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    values = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
    if values and values[0].dtype.kind in "fiu":  # Not the config text.
      scalars[tag] = [(e.step, float(v)) for e, v in zip(events, values)]
  return scalars
