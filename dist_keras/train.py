"""Trains a Keras model data-parallel under tf.distribute.

  python -m dist_keras.train --config=NAME|PATH.py[:ARG] --workdir=DIR \
      [--config.train.steps=500 ...]

--config takes a built-in config by name (lstm_longmem, cnn_shapes, ...;
configs/NAME.py in the repository) or a config file's path. With no flags:
the default config (lstm_longmem) into a fresh runs/<timestamp> folder.
Exit codes (errors.py): 0 done, 1 an unexpected error (rerun with --verbose
for the traceback), 2 a bad value (fix the command), 3 training diverged,
143 preempted by SIGTERM (rerun to resume), 200 a peer worker was lost
(rerun every worker to resume).
"""
import os
import sys

# Quiet TensorFlow's C++ start-up chatter (oneDNN, CPU feature lines) before
# it is imported; real errors still print. An explicit setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import datetime  # pylint: disable=g-import-not-at-top
import re
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from dist_keras import configs, errors, quiet, tfconfig

DEFAULT_CONFIG = configs.path("lstm_longmem")


def _exit_bad_command_line(message: str) -> None:
  """One line and exit 2: the same contract as every other bad value."""
  print(f"dist_keras: error: {message}", file=sys.stderr, flush=True)
  sys.exit(errors.EXIT_CONFIG_ERROR)


def _define_config_flag():
  # config_flags applies --config.KEY=VALUE overrides while defining the
  # flag, so an unknown key fails here, at import, with a traceback.
  try:
    return config_flags.DEFINE_config_file(
        "config", DEFAULT_CONFIG, "A built-in config's name (e.g. "
        "cnn_shapes) or a config file: PATH.py[:ARG]; override keys with "
        "--config.SECTION.KEY=VALUE.", lock_config=True)
  except (AttributeError, KeyError) as e:
    text = str(e)
    key = re.search(r"'(\w+)\\?'", text)
    hint = re.search(r'Did you mean "(\w+)"', text)
    given = [a.split("=")[0] for a in sys.argv[1:] if a.startswith(
        "--config.") and key and f".{key.group(1)}" in a.split("=")[0]]
    _exit_bad_command_line(
        f"{given[0] if given else text.splitlines()[0]} names no config key"
        + (f" (did you mean {hint.group(1)!r}?)" if hint else "")
        + "; every key and its default is in configs/base.py.")


_CONFIG = _define_config_flag()
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run folder (config.json, summary.json, model.keras, "
    "checkpoints/, TensorBoard events). Default: runs/<timestamp>.")
_VERBOSE = flags.DEFINE_bool("verbose", False,
                             "Print tracebacks and TensorFlow's log lines.")


def default_workdir() -> str:
  return os.path.join("runs", datetime.datetime.now().strftime(
      "%Y%m%d-%H%M%S"))


def main(argv) -> None:
  if not _VERBOSE.value:
    logging.set_verbosity(logging.WARNING)  # tf.distribute's INFO chatter.
  try:
    if len(argv) > 1:
      raise errors.UserError(f"unexpected arguments {argv[1:]}; the options "
                             "are --config, --workdir, --config.KEY=VALUE.")
    sys.exit(_train(_CONFIG.value, _WORKDIR.value or default_workdir()))
  except (errors.UserError, errors.Preempted) as e:
    _fail(e, e.exit_code)
  except Exception as e:  # pylint: disable=broad-except
    lost = peer_lost(e)
    if lost:
      _fail(lost, lost.exit_code)
    _fail(e, errors.EXIT_UNEXPECTED)


def _train(config, workdir: str) -> int:
  # Order matters: TF_CONFIG is checked before TensorFlow starts (a typo
  # there fails now, not as a gRPC hang later); dist_keras.fit checks the
  # config before the strategy splits the CPU into logical devices and
  # before anything else initialises TensorFlow.
  tfconfig.from_env()
  with quiet.startup_lines_filtered(enabled=not _VERBOSE.value):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  api.fit(config.model.name, config.data.name, workdir=workdir,
          config=config)
  return 0


# What TensorFlow raises in a collective when a peer dies or stops
# answering (gRPC unavailable, coordination-service heartbeat timeout).
_PEER_ERRORS = ("UnavailableError", "AbortedError", "CancelledError",
                "DeadlineExceededError")
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def peer_lost(error: Exception):
  """A PeerLost for a multi-worker job's lost-peer error, else None."""
  cluster = tfconfig.from_env()  # Checked at start-up: parses cleanly.
  if type(error).__name__ not in _PEER_ERRORS or cluster is None:
    return None
  text = str(error)
  me = (cluster.task_type, cluster.task_index)
  others = [m for m in _TASK.finditer(text)
            if (m.group(1), int(m.group(2))) != me]
  who = (f"task {others[0].group(1)}:{others[0].group(2)}" if others
         else "a peer task")
  return errors.PeerLost(
      f"lost contact with {who} ({type(error).__name__}: {_cause(text)}); "
      "the job "
      "must restart: rerun it on every worker (tools/launch_local.py "
      "--max_restarts does) to resume from the last checkpoint.")


_BOILERPLATE = ("Graph execution error", "Detected at node", "[[",
                "The error could be", "Additional GRPC", ":UNKNOWN")


def _cause(text: str) -> str:
  """The line of a TF runtime error that says what happened (not where)."""
  for line in text.splitlines():
    if line.strip() and not line[0].isspace() and not line.startswith(
        _BOILERPLATE):
      return line.strip()[:160]
  return " ".join(text.split())[:160]


def _fail(error: Exception, code: int) -> None:
  if _VERBOSE.value:
    traceback.print_exc()
  message = str(error).splitlines()[0] if str(error) else type(error).__name__
  if code == errors.EXIT_UNEXPECTED:
    message = (f"{type(error).__name__}: {message} (unexpected; rerun with "
               "--verbose for the traceback)")
  print(f"dist_keras: error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def _parse_flags(argv):
  """absl's parsing, with a wrong type or unloadable --config as one line
  and exit 2 (absl's own handler prints two lines and exits 1)."""
  try:
    rest = flags.FLAGS(argv)
    # A config that failed to load is a stand-in raising on first use.
    _ = _CONFIG.value.runtime
    return rest
  except flags.Error as e:
    if not str(e).startswith("flag --config="):
      _exit_bad_command_line(f"{str(e).splitlines()[0]}; fix the value's "
                             "type (see configs/base.py).")
    _exit_bad_command_line(f"{str(e).split(':')[0][5:]} could not be loaded "
                           f"(the file or its argument); {_CONFIG_HINT}")
  except (OSError, ImportError, SyntaxError, AttributeError) as e:
    given = [a for a in argv[1:] if a.startswith("--config=")]
    _exit_bad_command_line(
        f"{given[-1] if given else '--config'} could not be loaded "
        f"({type(e).__name__}: {_first_line(e)}); {_CONFIG_HINT}")


_CONFIG_HINT = (f"pass a built-in config ({', '.join(configs.names())}) or "
                "a config file's path.")


def _first_line(error: Exception) -> str:
  return str(error).splitlines()[0][:200] if str(error) else "no message"


def builtin_config_paths(argv: list[str]) -> list[str]:
  """`argv` with `--config=NAME[:ARG]` of a built-in config turned into its
  file's path (which absl's config flag loads), e.g. --config=cnn_shapes.

  A path that exists wins over a built-in of the same name.
  """
  out, argv = [], list(argv)
  while argv:
    arg = argv.pop(0)
    if arg == "--config" and argv:  # `--config NAME`
      arg = f"--config={argv.pop(0)}"
    if arg.startswith("--config="):
      name, colon, rest = arg[len("--config="):].partition(":")
      if name in configs.names() and not os.path.exists(name):
        arg = f"--config={configs.path(name)}{colon}{rest}"
    out.append(arg)
  return out


def run() -> None:
  """Console-script entry point (`dist-keras-train`)."""
  sys.argv[:] = builtin_config_paths(sys.argv)
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
