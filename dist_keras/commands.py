"""What the package's small commands share (`python -m dist_keras.launch`,
`python -m dist_keras.prepare_data`): one-line argument errors and their
own lines on stderr, `PROG: message`.

A bad argument raises UserError, one line naming the fix; main() hands it
to `fail`, which says `PROG: error: MESSAGE` and returns exit status 2
before anything has run. No TensorFlow here: the launcher only starts
processes.
"""
import argparse
import threading

from dist_keras import terminal
from dist_keras.errors import EXIT_CONFIG_ERROR, UserError

# One lock for stdout and stderr: a command's own line and a line it relays
# (the launcher's workers) never interleave mid-line on one terminal.
LOCK = threading.Lock()


class Parser(argparse.ArgumentParser):
  """argparse whose errors are a UserError: one line, no usage block."""

  def error(self, message):
    raise UserError(f"{message}; see --help.")


def say(prog: str, message: str) -> None:
  """One line on stderr (progress, a warning, an error) after `prog: `."""
  with LOCK:
    terminal.say(f"{prog}: {message}", err=True)


def fail(prog: str, error: Exception) -> int:
  """Says `error` as the command's one-line error; returns exit status 2."""
  say(prog, f"error: {error}")
  return EXIT_CONFIG_ERROR


def relay(data: bytes, err: bool) -> None:
  """Another process's output, on stdout (stderr: `err`), whole lines."""
  with LOCK:
    terminal.relay(data, err)
