"""TensorBoard summaries, written by the chief only.

Every other worker gets a no-op writer, so callers never branch on the role.
"""
import json

import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util


class Summaries:
  """Scalars and text for TensorBoard, in `logdir`, on the chief only."""

  def __init__(self, logdir: str, enabled: bool):
    self.logdir = logdir
    self.enabled = enabled
    self._writer = (tf.summary.create_file_writer(logdir) if enabled
                    else tf.summary.create_noop_writer())

  def scalars(self, step: int, values: dict) -> None:
    """Writes each `name: value` at `step` (None values are skipped)."""
    with self._writer.as_default(step=step):
      for name, value in values.items():
        if value is not None:
          tf.summary.scalar(name, value)

  def config(self, config_dict: dict, step: int = 0) -> None:
    """The resolved config as pretty JSON in the Text tab."""
    text = "```\n" + json.dumps(config_dict, indent=2, sort_keys=True) + "\n```"
    with self._writer.as_default(step=step):
      tf.summary.text("config", text)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every scalar summary in `logdir`.

  For tools and tests: reads the event files back as TensorBoard does.
  """
  acc = event_accumulator.EventAccumulator(
      logdir, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  scalars = {}
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    values = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
    if values and values[0].dtype.kind in "fiu":  # Not the config text.
      scalars[tag] = [(e.step, float(v)) for e, v in zip(events, values)]
  return scalars
