"""Runs a command pinned to a set of CPU cores (Linux CPU affinity).

  python tools/pin_cores.py --cores=0,1 -- python -m dist_keras.train ...
  # Under tools/launch_local.py, one set per worker, picked by the worker's
  # TF_CONFIG task index (worker 0 on core 0, 1 on core 1, 2 on core 0):
  python tools/launch_local.py --num_workers=3 -- \\
      python tools/pin_cores.py --cores=0/1/0 -- python -m dist_keras.train ...

The command REPLACES this process (exec): same pid, same process group, so
signals reach it as if it had been started directly. TensorFlow sizes its
thread pools from the affinity mask, so a run pinned to K cores computes on
K cores, which is what makes the replicas of a CPU scaling sweep bring their
own hardware (tools/scaling.py).

Exit status: the command's; 2 for bad arguments; 127 if it cannot start.
"""
import json
import os
import sys

import common
from common import BadInput

PROG = "pin_cores"
USAGE = "usage: pin_cores.py --cores=SETS -- COMMAND ..."
EXIT_CANNOT_START = 127


def parse_sets(text: str) -> list[set[int]]:
  """"0,1" -> [{0, 1}]; "0/1/0" -> [{0}, {1}, {0}] (one set per task)."""
  try:
    sets = [{int(c) for c in part.split(",")} for part in text.split("/")]
  except ValueError:
    sets = []
  if not sets or any(min(s) < 0 for s in sets):
    raise BadInput(f"--cores={text!r} must be comma-separated core numbers, "
                   "with '/' between the sets of successive tasks, e.g. "
                   "0,1 or 0/1.")
  return sets


def task_index(environ) -> int:
  """This process's TF_CONFIG task index (0 without TF_CONFIG)."""
  if "TF_CONFIG" not in environ:
    return 0
  try:
    return int(json.loads(environ["TF_CONFIG"])["task"]["index"])
  except (ValueError, KeyError, TypeError) as e:
    raise BadInput(f"TF_CONFIG has no task index ({e!r}); pass one core set "
                   "or set TF_CONFIG as tools/launch_local.py does.") from None


def choose(sets: list[set[int]], environ) -> set[int]:
  """The core set of this process: its task's, or the only one."""
  if len(sets) == 1:
    return sets[0]
  index = task_index(environ)
  if not 0 <= index < len(sets):
    raise BadInput(f"task index {index} but --cores names {len(sets)} "
                   "set(s); give one per task.")
  return sets[index]


def parse_args(argv: list[str]) -> tuple[list[set[int]], list[str]]:
  """(the core sets, the command). Not argparse: everything after `--` is
  the command's, and before it --cores is the only option."""
  if argv in (["--help"], ["-h"]):
    print(f"{USAGE}\n\n{__doc__.strip()}")
    sys.exit(0)
  if "--" not in argv:
    raise BadInput(USAGE)
  split = argv.index("--")
  options, command = argv[:split], argv[split + 1:]
  if len(options) != 1 or not options[0].startswith("--cores="):
    raise BadInput("pass exactly --cores=SETS before --, e.g. --cores=0,1.")
  if not command:
    raise BadInput("give the command after --.")
  return parse_sets(options[0][len("--cores="):]), command


def main(argv=None) -> int:
  try:
    sets, command = parse_args(list(sys.argv[1:] if argv is None else argv))
    cores = choose(sets, os.environ)
    available = os.sched_getaffinity(0)
    if not cores <= available:
      raise BadInput(f"cores {sorted(cores - available)} are not available "
                     f"to this process (it may use {sorted(available)}).")
    os.sched_setaffinity(0, cores)
  except BadInput as e:
    return common.fail(PROG, e)
  try:
    os.execvp(command[0], command)
  except OSError as e:
    common.say(PROG, f"cannot start {command[0]!r}: {e.strerror or e}")
    return EXIT_CANNOT_START


if __name__ == "__main__":
  sys.exit(main())
