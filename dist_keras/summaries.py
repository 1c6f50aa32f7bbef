"""TensorBoard summaries, written by the chief only.

Every other worker gets a no-op writer, so callers never branch on the role.
"""
import json

import tensorflow as tf


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
