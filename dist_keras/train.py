"""Trains a Keras model data-parallel under tf.distribute.

  python -m dist_keras.train --config=NAME|PATH.py[:ARG] --workdir=DIR \\
      [--config.train.steps=500 ...]

--config takes a built-in config by name (lstm_longmem, cnn_shapes, ...:
the modules of dist_keras.configs) or a config file's path. With no flags:
the default config (lstm_longmem) into a fresh runs/<timestamp> folder.
Exit codes (errors.py): 0 done, 1 an unexpected error (rerun with --verbose
for the traceback), 2 a bad value (fix the command), 3 training diverged,
130 stopped by Ctrl-C and 143 preempted by SIGTERM (rerun to resume: the
step it stopped at was checkpointed), 200 a peer worker was lost
(rerun every worker to resume), 201 no checkpoint in the workdir reads back
(a copy may still be arriving: retry, else restore checkpoints/).
"""
import atexit
import os
import shlex
import signal
import sys

# Quiet TensorFlow's C++ start-up chatter (oneDNN, CPU feature lines) before
# it is imported; real errors still print. An explicit setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import datetime  # pylint: disable=g-import-not-at-top
import traceback

from absl import app, flags, logging

from dist_keras import (configs, disk, errors, installation, origins, quiet,
                        signals, terminal, validate)
from dist_keras.distribute import peers, tfconfig, tpu_env

_CONFIG = flags.DEFINE_string(
    "config", configs.DEFAULT, "A built-in config's name (e.g. cnn_shapes) "
    "or a config file: PATH.py[:ARG]; override keys with "
    "--config.SECTION.KEY=VALUE.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run folder (config.json, summary.json, model.keras, "
    "checkpoints/, TensorBoard events). Default: runs/<timestamp>.")
_VERBOSE = flags.DEFINE_bool("verbose", False,
                             "Print tracebacks and TensorFlow's log lines.")
# The --config.SECTION.KEY=VALUE overrides, split from argv before absl
# parses the rest (_parse_flags): "SECTION.KEY=VALUE" each.
_OVERRIDES: list[str] = []


def default_workdir() -> str:
  return os.path.join("runs", datetime.datetime.now().strftime(
      "%Y%m%d-%H%M%S"))


def main(argv) -> None:
  if not _VERBOSE.value:
    logging.set_verbosity(logging.WARNING)  # tf.distribute's INFO chatter.
  chosen = None  # A workdir this run named (runs/<time>): a rerun must too.
  try:
    if len(argv) > 1:
      raise errors.UserError(f"unexpected arguments {argv[1:]}; the options "
                             "are --config, --workdir, --config.KEY=VALUE.")
    config = configs.from_command_line(_CONFIG.value, _OVERRIDES)
    workdir = _WORKDIR.value
    if workdir is None:
      workdir = chosen = default_workdir()
    sys.exit(_train(config, workdir))
  except errors.KNOWN as e:
    _fail(e, e.exit_code, chosen)
  except KeyboardInterrupt as e:  # Not an Exception: Ctrl-C.
    _fail(_interrupted(e), errors.EXIT_INTERRUPTED, chosen)
  except Exception as e:  # pylint: disable=broad-except
    # (A lost peer, a full disk: api.run raises PeerLost, NoSpace.)
    _fail(e, errors.EXIT_UNEXPECTED, chosen)


def _interrupted(error: KeyboardInterrupt) -> errors.Interrupted:
  """The loop's own (this step checkpointed), or a bare Ctrl-C's: one
  before training began, or a second one that stopped it at once."""
  if isinstance(error, errors.Interrupted):
    return error
  return errors.Interrupted(
      "stopped by Ctrl-C without a checkpoint of the step it was at; rerun "
      "the same command to resume from the last one, if any.")


def _train(config, workdir: str) -> int:
  # Order matters: the config and TF_CONFIG are checked before TensorFlow
  # starts (a typo fails in a fraction of a second, not after TensorFlow's
  # start-up or as a gRPC hang later).
  validate.config(config)
  validate.workdir_named(workdir)
  # The strategy against TF_CONFIG (its contradictions), too.
  cluster = tfconfig.from_env()
  chosen = tfconfig.chosen(config.runtime.strategy, cluster)
  if cluster is None or cluster.is_chief:  # Only the chief writes there.
    disk.check_rerun(workdir)  # A rerun's workdir it can no longer write.
    validate.workdir(workdir)
  installation.check_tensorflow_installed()
  set_now = tpu_env.prepare_and_report(config.runtime.strategy,
                                       config.runtime.tpu, _VERBOSE.value)
  with quiet.startup_lines_filtered(enabled=not _VERBOSE.value):
    try:
      import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except Exception as e:  # pylint: disable=broad-except
      if not set_now:
        raise
      raise errors.UserError(
          f"TensorFlow could not load the TPU runtime "
          f"{os.environ.get('TF_PLUGGABLE_DEVICE_LIBRARY_PATH', '')} "
          f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
          "install a tensorflow-tpu and libtpu pair that match "
          f"({installation.install('tpu')}), or set PJRT_DEVICE yourself."
      ) from e
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  from dist_keras.distribute import iterators  # pylint: disable=g-import-not-at-top
  iterators.keep_until_exit()  # run() ends the process with os._exit.
  api.run(api.Job(config, workdir, chosen, to_exit=True))
  if tfconfig.is_multi_worker(cluster):
    _leave_together(cluster)
  return 0


def _leave_together(cluster) -> None:
  """A finished run's workers leave together, the chief last
  (distribute/leaving.py). A stop request while they wait ends the
  process at once (exit 143 or 130): the run's results are written, and
  the wait holds the interpreter, where no Python handler would run."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras.distribute import leaving, reports  # pylint: disable=g-import-not-at-top
  # (An ignored SIGINT, a job started in the background, stays ignored.)
  signals.take(signal.SIG_DFL, (signal.SIGTERM, signal.SIGINT))
  try:
    leaving.together(cluster)
  except tf.errors.OpError as e:
    # A peer's own error, which it reported while this worker waited (or
    # before it came): its line, as in a collective.
    stopped = reports.stopped(e)
    if stopped is not None:
      raise stopped from e
    # A peer died or failed after training (a peer's missed heartbeats
    # fail the barrier with an InternalError): not a bug of this run.
    raise errors.PeerLost(
        f"lost contact with {peers.who(e, cluster)} as the run ended "
        f"({type(e).__name__}: {errors.cause(str(e))}); rerun it on every "
        "worker (python -m dist_keras.launch --max_restarts does): a finished "
        "workdir is kept as it is, else the rerun writes the results."
    ) from e


def _fail(error: Exception, code: int, chosen_workdir=None) -> None:
  if _VERBOSE.value:
    terminal.say(traceback.format_exc(), err=True, end="")
  # (The line a peer says too, when this worker's error stops the job:
  # peers.report_text.)
  message = errors.first_line(error, limit=None)
  if code == errors.EXIT_UNEXPECTED and not isinstance(error, errors.KNOWN):
    # A user's function's own error is theirs, not an unexpected one; the
    # traceback is printed above already with --verbose.
    said = [] if origins.in_users_code(error) else ["unexpected"]
    if not _VERBOSE.value:
      said.append("rerun with --verbose for the traceback")
    message = origins.unexpected(error, said)
  # The same command without --workdir would start afresh in a new folder.
  if chosen_workdir and os.path.isdir(chosen_workdir):
    message += (f" (this run named its own workdir: add --workdir="
                f"{shlex.quote(chosen_workdir)} to the command to rerun in it)")
  _say_error(message)
  sys.exit(code)


def _say_error(message: str) -> None:
  """The error's line on stderr, if stderr is still there: a closed pipe
  (`| tee` whose session ended) must not turn exit 143 into exit 1."""
  terminal.error(message)


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """(argv without them, the overrides): each --config.KEY=VALUE (or
  --config.KEY VALUE) as "KEY=VALUE"; a bare --config.KEY as "KEY" (true,
  for a bool) and --noconfig.KEY as "KEY=false", as absl reads bools."""
  rest, overrides, argv = [], [], list(argv)
  while argv:
    arg = argv.pop(0)
    if arg.startswith("--noconfig."):  # absl's spelling of a false bool.
      overrides.append(f"{arg[len('--noconfig.'):]}=false")
    elif not arg.startswith("--config."):
      rest.append(arg)
    elif "=" in arg or not argv or argv[0].startswith("--"):
      overrides.append(arg[len("--config."):])  # Bare: a bool's true.
    else:
      overrides.append(f"{arg[len('--config.'):]}={argv.pop(0)}")
  return rest, overrides


def _parse_flags(argv):
  """absl's parsing of all but the overrides, with a bad flag as one line
  and exit 2 (absl's own handler prints two lines and exits 1)."""
  rest, _OVERRIDES[:] = split_overrides(argv)
  if any(arg in ("--help", "-h", "-?", "--helpshort") for arg in rest[1:]):
    _print_help()
    sys.exit(0)  # absl's own --help exits 1, which means a bug here.
  if "--helpfull" in rest[1:]:
    terminal.say(flags.FLAGS.get_help())
    sys.exit(0)
  try:
    return flags.FLAGS(rest)
  except flags.Error as e:
    _exit_bad_command_line(f"{str(e).splitlines()[0]}; see --help.")


def _print_help() -> None:
  """This module's docstring and flags, whichever script runs it (absl's
  own help reads the __main__ module's, which a console script lacks)."""
  listed = flags.FLAGS.module_help(sys.modules[__name__]).strip().split(
      "\n", 1)
  terminal.say(f"{__doc__.rstrip()}\n\nflags:\n{listed[-1]}\n\nTry --helpfull "
               "to get a list of all flags.")


def _exit_bad_command_line(message: str) -> None:
  """One line and exit 2: the same contract as every other bad value."""
  _say_error(message)
  sys.exit(errors.EXIT_CONFIG_ERROR)


def run() -> None:
  """Console-script entry point (`dist-keras-train`)."""
  _fill_closed_streams()
  # The current folder on the path, as `python -m dist_keras.train` has it
  # (a console script has its own folder instead): a config file and a
  # PKG.MODULE:FN import the user's modules from there alike.
  if "" not in sys.path and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    app.run(main, flags_parser=_parse_flags)
  except SystemExit as e:
    # The run has written and closed all it writes (summary.json, or the
    # checkpoint and the one line); a finished cluster's workers have met
    # at the final barrier (_leave_together). Python's own exit would then
    # destroy a training iterator, which waits for tf.data's autotune
    # thread to end its sleep: 7-60 s here (TF 2.21), past what a user
    # pressing Ctrl-C, or a pod's 30 s grace period after SIGTERM, waits,
    # long after the last line of a finished run, and past the heartbeat
    # timeout of a cluster's coordination service (distribute/leaving.py).
    code = e.code
    if code is None:  # sys.exit() with no code: 0, as in Python.
      code = 0
    elif not isinstance(code, int):
      terminal.say(str(code), err=True)  # What sys.exit("...") prints.
      code = 1
    terminal.flush()  # A closed pipe costs its lines: the code stands.
    # What os._exit would skip: the handlers registered with atexit (a
    # user's config or module's: a tracker's finish, a log flush; autograph's
    # removal of the modules it generated: 8 files a run were left in the
    # temporary directory). Not the rest of Python's exit (above).
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    terminal.flush()
    os._exit(code)


def _fill_closed_streams() -> None:
  """/dev/null in place of a stdout or stderr closed when Python started
  (`>&-`; sys.stdout is then None): the first file the run opened would
  take that descriptor, and a library's write to "stdout" would land in
  it."""
  for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
    if stream is not None:
      continue
    try:
      os.fstat(fd)
    except OSError:  # Free: fill it.
      devnull = os.open(os.devnull, os.O_WRONLY)
      if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


if __name__ == "__main__":
  run()
