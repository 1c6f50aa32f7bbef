"""What the tools share: the checkout on sys.path, one-line argument errors,
progress lines, the --config argument, and one training run in a subprocess.

A tool runs as a script (`python tools/NAME.py`), so Python puts tools/ on
sys.path and `import common` finds this module; importing it puts the
checkout there too, so `import dist_keras` works from a checkout that is not
installed. Nothing here imports TensorFlow at import time (pin_cores.py
runs any command and needs none); the lines and argument errors are the
package's small commands' (dist_keras/commands.py, TensorFlow-free).

Errors: a bad argument raises BadInput, one line naming the fix; a tool's
main() hands it to `fail`, which prints `PROG: error: MESSAGE` and returns
exit status 2 before anything has run.
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from dist_keras import commands  # pylint: disable=wrong-import-position

EXIT_BAD_INPUT = 2
# One lock for stdout and stderr: a tool's own line and a line another
# thread of it says never interleave mid-line on one terminal.
OUTPUT_LOCK = commands.LOCK


class BadInput(ValueError):
  """A bad command-line value; its message is one line naming the fix."""


class RunFailed(SystemExit):
  """A training run exited non-zero. Uncaught, it ends the tool with exit
  status 1 and its message, which ends with the run's last stderr."""


class Parser(commands.Parser):
  """argparse whose errors are a BadInput: one line, no usage block."""

  def error(self, message):
    raise BadInput(f"{message}; see --help.")


say = commands.say  # One line on stderr after `prog: `.
fail = commands.fail  # The one-line error; returns exit status 2.


# ---- the config -------------------------------------------------------------


def add_config_args(parser: argparse.ArgumentParser,
                    overrides: bool = True) -> None:
  """--config and, with `overrides`, the repeatable --override."""
  from dist_keras import configs  # pylint: disable=g-import-not-at-top
  parser.add_argument(
      "--config", default=configs.DEFAULT,
      help="A built-in config's name (e.g. cnn_shapes) or a config file: "
      "PATH.py[:ARG] (default %(default)s).")
  if overrides:
    parser.add_argument("--override", action="append", default=[],
                        metavar="SECTION.KEY=VALUE",
                        help="A config override for every run (repeatable).")


def load_config(spec: str, overrides=(), flag: str = "--override="):
  """The config `spec` names with `overrides`, every value checked.

  The tools' one path to a config: dist_keras.configs.from_command_line,
  then dist_keras.validate.config, as `python -m dist_keras.train` does. A
  typo thus fails at once, not after every run of a sweep has failed alike.

  Args:
    spec: --config's text: a built-in name or a file, either with ":ARG".
    overrides: "section.key=value" texts.
    flag: how the user spelled an override before its text, so that the
      error quotes what they typed ("--override=", "--config.").

  Raises:
    BadInput: one line naming the bad config, override or value.
  """
  # pylint: disable=g-import-not-at-top
  from dist_keras import configs, errors, validate
  try:
    config = configs.from_command_line(spec, overrides, flag=flag)
    validate.config(config)
  except errors.UserError as e:
    raise BadInput(str(e)) from None
  return config


def refuse_run_keys(overrides, run_keys: dict) -> None:
  """Refuses an override of a key the tool sets for each of its runs.

  Args:
    overrides: --override's "section.key=value" texts.
    run_keys: {key: the tool's flag that sets it, or None}.

  Raises:
    BadInput: naming the override and the flag to use instead.
  """
  for override in overrides:
    key = override.split("=", 1)[0]
    if key in run_keys:
      raise BadInput(
          f"--override={override}: the tool sets {key} for each run"
          + (f"; use {run_keys[key]} instead." if run_keys[key] else "."))


def child_spec(spec: str) -> str:
  """--config's text as a run in another directory reads it: a config
  file's path made absolute, a built-in name as it is."""
  name, colon, arg = spec.partition(":")
  return os.path.abspath(name) + colon + arg if os.path.exists(name) else spec


def require_empty(flag: str, folder: str) -> None:
  """Refuses a `folder` that holds anything: a run's workdir holding a
  checkpoint would resume from it instead of training afresh."""
  if folder and os.path.isdir(folder) and os.listdir(folder):
    raise BadInput(f"{flag}={folder} is not empty; its runs would resume "
                   "instead of training. Name a new folder.")


# ---- runs -------------------------------------------------------------------


TRAINER = ("-m", "dist_keras.train")


def train(spec: str, workdir: str, overrides, entry=TRAINER):
  """Trains config `spec` into `workdir` in a subprocess, as a user would.

  Calibration and progress lines are off: the tools time whole runs, and
  the post-training calibration would add seconds that are not training.

  Args:
    spec: --config's text.
    workdir: the run's folder.
    overrides: "--config.SECTION.KEY=VALUE" arguments; the last of a key
      wins.
    entry: what follows `python` to start the trainer.

  Returns:
    (summary.json as a dict, wall seconds of the whole command).

  Raises:
    RunFailed: the run failed; carries the end of its stderr.
  """
  command = [sys.executable, *entry, f"--config={child_spec(spec)}",
             f"--workdir={workdir}", "--config.log.progress=False",
             "--config.log.calibration_steps=0", *overrides]
  start = time.monotonic()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          check=False)
  seconds = time.monotonic() - start
  if result.returncode:
    raise RunFailed(f"the run into {workdir} failed (exit "
                    f"{result.returncode}); its last lines:\n"
                    f"{result.stderr.strip()[-2000:]}")
  return read_summary(workdir), seconds


class ChildFailed(RuntimeError):
  """A tool's own child process (the tool again, with --only) failed; its
  text says how."""


def child_result(command: list, result: str, error: str):
  """The JSON after `result` on the last stdout line that starts with it,
  of `command` run to its end in a new process (each run its own, as users
  start each tool).

  Raises:
    ChildFailed: it exited non-zero or printed no result; names its own
      line after `error`, else stderr's last (TensorFlow's shutdown lines
      can follow a traceback there).
  """
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = done.stdout.splitlines()
  results = [line[len(result):] for line in lines if line.startswith(result)]
  if done.returncode or not results:
    said = [line[len(error):] for line in lines if line.startswith(error)]
    last = (said or done.stderr.strip().splitlines() or ["no output"])[-1]
    raise ChildFailed(f"its process exited {done.returncode}: {last}")
  return json.loads(results[-1])


def one_line(error: Exception) -> str:
  """What went wrong, in one line (a TF error's cause, not its "where")."""
  from dist_keras import errors  # pylint: disable=g-import-not-at-top
  if isinstance(error, (ChildFailed, errors.UserError)):  # Its fix, whole.
    return str(error)
  return f"{type(error).__name__}: {errors.cause(str(error))}"


def read_summary(workdir: str) -> dict:
  """The run's summary.json. Raises ValueError saying what is wrong."""
  path = os.path.join(workdir, "summary.json")
  try:
    with open(path) as f:
      return json.load(f)
  except OSError as e:
    raise ValueError(f"no readable {path} ({e.strerror})") from None
  except json.JSONDecodeError:
    raise ValueError(f"{path} is not valid JSON") from None


def write_atomically(path: str, write) -> None:
  """Calls write(tmp_path), then renames: `path` is whole or absent."""
  tmp = path + ".tmp"
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_json(path: str, data) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      f.write(json.dumps(data, indent=2) + "\n")
  write_atomically(path, write)
