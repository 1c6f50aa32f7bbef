"""Errors the user can fix, and the exit codes they map to.

Exit codes (documented in the README):
  2   configuration or input error: permanent, fix the command and rerun.
  1   an unexpected error (a bug): rerun with --verbose for the traceback.
"""

EXIT_CONFIG_ERROR = 2
EXIT_UNEXPECTED = 1


class UserError(ValueError):
  """A bad value the user can fix; its message is one line naming the fix."""

  exit_code = EXIT_CONFIG_ERROR
