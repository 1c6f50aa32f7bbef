"""Errors the user can fix, and the exit codes they map to.

Exit codes (documented in the README):
  2   configuration or input error: permanent, fix the command and rerun.
  3   training diverged (non-finite loss or gradients): permanent at this
      learning rate; the last good checkpoint is kept.
  1   an unexpected error (a bug): rerun with --verbose for the traceback.
  143 preempted (SIGTERM): a checkpoint of the current step was saved;
      RETRYABLE, rerunning the same command resumes from it.
  200 a peer worker was lost: RETRYABLE (>= 128, as Kubernetes' ExitCode
      restart policy and tools/launch_local.py --max_restarts read it);
      rerunning the same command resumes from the last checkpoint.
"""

EXIT_CONFIG_ERROR = 2
EXIT_DIVERGED = 3
EXIT_UNEXPECTED = 1
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a killed process would return.
EXIT_PEER_LOST = 200
# What a launcher or Kubernetes should do with each: a permanent failure
# fails alike when rerun; a retryable one resumes from a checkpoint.
PERMANENT = (EXIT_UNEXPECTED, EXIT_CONFIG_ERROR, EXIT_DIVERGED)
RETRYABLE = (EXIT_PREEMPTED, EXIT_PEER_LOST)


class UserError(ValueError):
  """A bad value the user can fix; its message is one line naming the fix."""

  exit_code = EXIT_CONFIG_ERROR


class Diverged(UserError):
  """Loss or gradients became non-finite; nothing after it was saved."""

  exit_code = EXIT_DIVERGED


class PeerLost(RuntimeError):
  """Another worker of the job stopped answering: retry the whole job."""

  exit_code = EXIT_PEER_LOST


class Preempted(RuntimeError):
  """SIGTERM arrived; the current step was checkpointed: retry to resume."""

  exit_code = EXIT_PREEMPTED
