"""Errors the user can fix, and the exit codes they map to.

Exit codes (documented in the README):
  2   configuration or input error: permanent, fix the command and rerun.
  3   training diverged (non-finite loss or gradients): permanent at this
      learning rate; the last good checkpoint is kept.
  1   an unexpected error (a bug): rerun with --verbose for the traceback;
      also a condition of the machine with its own line, which a rerun
      as it is would meet again: a full disk (NoSpace), a workdir that
      can no longer be written (NoWriteAccess) or one removed under the
      run (WorkdirRemoved). Permanent: fix it, then rerun the same
      command (it resumes from the last checkpoint kept).
  130 interrupted (Ctrl-C, SIGINT): as 143, at the user's request; a
      second Ctrl-C stops at once, without the checkpoint.
  143 preempted (SIGTERM): a checkpoint of the current step was saved;
      RETRYABLE, rerunning the same command resumes from it.
  200 a peer worker was lost, or never started within
      runtime.peer_start_timeout_seconds: RETRYABLE (>= 128, as
      Kubernetes' ExitCode restart policy and dist_keras.launch's
      --max_restarts read it); rerunning the same command resumes from
      the last checkpoint.
  201 no checkpoint in the workdir reads back (all damaged): RETRYABLE, a
      copy still arriving or a flaky read heals; else restore the folder.
  A peer lost, or a start past that timeout, while TensorFlow's collective
  runtime starts ends the process killed (SIGKILL: 137 to a shell), its
  line said first: no Python runs in that wait (distribute/start_watch.py).
"""
import re

EXIT_CONFIG_ERROR = 2
EXIT_DIVERGED = 3
EXIT_UNEXPECTED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C.
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a killed process would return.
EXIT_PEER_LOST = 200
EXIT_NO_INTACT_CHECKPOINT = 201
# What a launcher or Kubernetes should do with each: a permanent failure
# fails alike when rerun; a retryable one resumes from a checkpoint.
PERMANENT = (EXIT_UNEXPECTED, EXIT_CONFIG_ERROR, EXIT_DIVERGED)
RETRYABLE = (EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_PEER_LOST,
             EXIT_NO_INTACT_CHECKPOINT)


class UserError(ValueError):
  """A bad value the user can fix; its message is one line naming the fix.

  Attributes:
    every_worker: every worker of a cluster raised it together (a check of
      a collective's sum, after they met): none tells the others of it.
  """

  exit_code = EXIT_CONFIG_ERROR
  every_worker = False


class Diverged(UserError):
  """Loss or gradients became non-finite; nothing after it was saved."""

  exit_code = EXIT_DIVERGED


class StoppedByPeer(UserError):
  """Another worker of the cluster stopped the job with its own one-line
  error (a refusal of its data, exit 2; an error its user's function
  raised, exit 1): this worker says that line, naming the worker, with its
  exit code; a rerun fails alike until it is fixed."""

  every_worker = True  # Told by the worker that raised it.

  def __init__(self, message: str, exit_code: int = EXIT_CONFIG_ERROR):
    super().__init__(message)
    self.exit_code = exit_code


class PeerLost(RuntimeError):
  """Another worker of the job stopped answering: retry the whole job."""

  exit_code = EXIT_PEER_LOST


class PeersNeverStarted(PeerLost):
  """Other workers of the job never started listening at their TF_CONFIG
  addresses within runtime.peer_start_timeout_seconds; nothing was written.
  Retryable as a lost peer: a pod still Pending may be running by the time
  this one is restarted (a wrong address fails alike each time, and says
  so each time)."""


class Preempted(SystemExit):
  """SIGTERM arrived; the current step was checkpointed: retry to resume.

  A SystemExit with code 143 and its one line as str(): a script that does
  not catch it ends as a preempted command line does, exit 143 with no
  traceback (dist_keras.fit has printed the line), which a launcher or
  Kubernetes restarts (>= 128); a RuntimeError's exit 1 read as a bug. As
  a SIGTERM's default action would end the script, the script's own
  handling of a failure (an `except Exception`) does not take it for one.
  """

  exit_code = EXIT_PREEMPTED

  def __init__(self, message: str):
    super().__init__(message)
    self.code = EXIT_PREEMPTED  # What the interpreter exits with.


class Interrupted(KeyboardInterrupt):
  """Ctrl-C (SIGINT): the current step was checkpointed, or (a second
  Ctrl-C, or one before training began) nothing was: rerun to resume. A
  KeyboardInterrupt, so that a script's or notebook's handling of Ctrl-C
  still sees one."""

  exit_code = EXIT_INTERRUPTED


class NoIntactCheckpoint(RuntimeError):
  """Checkpoints are in the workdir but none reads back: retry (a copy may
  still be arriving), or restore them from a backup."""

  exit_code = EXIT_NO_INTACT_CHECKPOINT


class NoSpace(OSError):
  """The disk filled up while the run wrote (a checkpoint, an event file,
  model.keras): a condition of the machine, not a bug, so its own line; exit
  1 all the same, as restarting without freeing space would fail again."""

  exit_code = EXIT_UNEXPECTED


class NoWriteAccess(OSError):
  """The workdir, or its checkpoints/, cannot be written (a read-only file
  system, its permissions): its own line (disk.py), exit 1 as NoSpace; a
  rerun once it is writable resumes."""

  exit_code = EXIT_UNEXPECTED


class WorkdirRemoved(RuntimeError):
  """The workdir was removed (or moved) while the run went: the run stops
  after the checkpoint it was saving, which made the folder anew."""

  exit_code = EXIT_UNEXPECTED


# Errors with their own exit code (the rest exit 1, or 200 when a peer is
# lost).
KNOWN = (UserError, Preempted, PeerLost, NoIntactCheckpoint, NoSpace,
         NoWriteAccess, WorkdirRemoved)


# Lines of a TensorFlow runtime error that say where, not what.
BOILERPLATE = ("Graph execution error", "Detected at node", "[[",
               "The error could be", "Additional GRPC", ":UNKNOWN",
               "<stack traces unavailable>")
# Keras' wrapping of an error a layer's call raised (its message follows in
# bold, then the call's arguments).
_KERAS_CALL = re.compile(r"^Exception encountered when calling (\S+)\.$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# An eager op's error: "{{function_node __wrapped__Cast_device_/job:...}}
# Cast string to float is not supported [Op:Cast] name: ".
_EAGER_OP = re.compile(r"^\{\{function_node [^}]*\}\}\s*(.*?)(\s+name:)?$")
# "  (0) INVALID_ARGUMENT:  what happened", under "N root error(s) found."
_ROOT_ERROR = re.compile(r"^\s+\(0\) [A-Z_]+:\s*(\S.*)$")
# tf.data's wrapping of what a dataset's own function raised: the iterator's
# path (Iterator::Root::Prefetch::...) would fill the line.
IN_DATASET_FN = re.compile(r"Error in user-defined function passed to "
                           r"(\w+?)(?::\d+)? transformation with iterator: "
                           r"\S+: ")


def first_line(error: BaseException, limit: int | None = 240) -> str:
  """An exception's message as one line for a one-line error: its first
  non-empty line, spaces collapsed, at most `limit` characters (None: all
  of it, as a UserError's own line is said); its type's name if it has no
  message. Under Keras' "Exception encountered when
  calling X.call()." the line is the layer's own message, which follows."""
  while len(error.args) == 1 and isinstance(error.args[0], BaseException):
    error = error.args[0]  # ml_collections' AttributeError(KeyError(...)).
  text = _ANSI.sub("", str(error.args[0] if len(error.args) == 1 else error))
  lines = [" ".join(line.split()) for line in text.splitlines()]
  lines = [line for line in lines if line] or [type(error).__name__]
  wrapped = _KERAS_CALL.match(lines[0])
  line = (f"in {wrapped.group(1)}: {lines[1]}" if wrapped and len(lines) > 1
          else lines[0])
  line = _EAGER_OP.sub(r"\1", line)
  if limit is None or len(line) <= limit:
    return line
  return line[:limit - 3].rsplit(" ", 1)[0] + "..."  # Not mid-word.


def cause(text: str) -> str:
  """The line of a TF runtime error's text that says what happened: the
  first root error's, else its first line that is not boilerplate."""
  lines = text.splitlines()
  for line in lines:
    first_root = _ROOT_ERROR.match(line)
    if first_root:
      return _short(first_root.group(1))
  for line in lines:
    if (line.strip() and not line[0].isspace()
        and not line.startswith(BOILERPLATE)
        and not line.endswith("root error(s) found.")):
      return _short(line)
  return _short(" ".join(text.split()))


def _short(line: str, limit: int = 160) -> str:
  """`line` for a one-line message: at most `limit` characters, cut at a
  word's end with "..." (not mid-word, as if that were all it said)."""
  line = IN_DATASET_FN.sub(r"in a tf.data function (\1): ", line.strip())
  if len(line) <= limit:
    return line
  return line[:limit - 3].rsplit(" ", 1)[0] + "..."
