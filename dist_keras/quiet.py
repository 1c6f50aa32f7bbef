"""Keeps TensorFlow's chatter off the user's terminal.

TensorFlow's C++ runtime prints INFO lines (oneDNN, CPU features) to fd 2
while it is imported, before TF_CPP_MIN_LOG_LEVEL can take effect. oneDNN
must stay on (off makes the CNN 1.5-3.6x slower here), so instead the
known start-up lines are filtered; anything else written meanwhile is
passed through unchanged. tf.distribute logs a line per collective it sets
up at INFO, which TensorFlow itself shows in an interactive session (a
notebook's kernel: it sets its logger to INFO there).
"""
import contextlib
import logging
import os
import tempfile

from dist_keras import terminal

NOISE = (
    "All log messages before absl::InitializeLog()",
    "port.cc:",  # oneDNN custom operations are on ...
    "cpu_feature_guard.cc:",
    "To enable the following instructions:",
)


@contextlib.contextmanager
def startup_lines_filtered(enabled: bool = True, noise=NOISE):
  """Captures fd 2 in the block and replays all but the `noise` lines
  (through terminal.say: a stderr that fails, or is closed, costs only
  them)."""
  if not enabled:
    yield
    return
  terminal.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      terminal.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode(errors="replace").splitlines(True):
        if not any(pattern in line for pattern in noise):
          terminal.say(line, err=True, end="")


@contextlib.contextmanager
def tf_info_lines_off():
  """TensorFlow's Python logger at WARNING in the block, as a plain script
  and the command line have it, where it is at its default (unset, or the
  INFO TensorFlow sets in an interactive session); a level set to DEBUG or
  WARNING and above is kept."""
  level = logging.getLogger("tensorflow").level
  if level not in (logging.NOTSET, logging.INFO):
    yield
    return
  with _tf_logger_at(logging.WARNING):
    yield


def tf_warnings_off():
  """TensorFlow's Python logger at ERROR in the block: for a call whose
  warnings are not the user's (the FLOPs profiler's about its own v1
  helpers) or that the caller says in its own line (a damaged checkpoint
  list)."""
  return _tf_logger_at(logging.ERROR)


@contextlib.contextmanager
def _tf_logger_at(level: int):
  """TensorFlow's Python logger at `level` in the block, then as it was."""
  logger = logging.getLogger("tensorflow")
  before = logger.level
  logger.setLevel(level)
  try:
    yield
  finally:
    logger.setLevel(before)
