"""Does a multi-worker job survive faults, and end where it would have?

Prints the seed and the plan, trains the job uninterrupted under
tools/launch_local.py, then again with --max_restarts while injecting the
planned faults at their steps (chaos_plan.py, chaos_run.py): SIGKILL of a
worker, SIGTERM (preemption), SIGSTOP of a worker past the collective
timeout (a hung peer), and a damaged latest checkpoint followed by a
SIGKILL. It reports each fault (exit code, restarts, step resumed from,
steps trained again, time lost) and whether the final weights and optimizer
state are bitwise equal to the uninterrupted run's (chaos_report.py).

  python tools/chaos.py --seed=1 --faults=4 --workdir=/tmp/chaos \\
      --override=train.global_batch_size=48 --override=model.units=16

Exit status: 0 if every planned fault was injected and survived and the
final weights are bitwise equal; 1 otherwise, with one line saying why; 2
for a bad argument (one line naming it), before anything runs.
"""
import os
import random
import sys

import chaos_plan
import chaos_report
import chaos_run
import common
from common import BadInput

PROG = "chaos"
# Keys the tool sets for both runs; what to use instead (None: nothing).
RUN_KEYS = {"train.steps": "--steps",
            "train.checkpoint_every": "--checkpoint_every",
            "runtime.timeout_seconds": "--collective_timeout",
            "train.log_every": None, "log.progress": None}


def parser() -> common.Parser:
  p = common.Parser(prog="chaos.py", description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--seed", type=int,
                 help="Seed of the plan (default: a random one, printed).")
  p.add_argument("--faults", type=int, default=4, help="Faults to inject.")
  p.add_argument("--kinds", default=",".join(chaos_plan.KINDS),
                 help="Kinds to deal the faults from (default %(default)s).")
  p.add_argument("--workdir", required=True,
                 help="New or empty: reference/, chaos/ and their logs.")
  p.add_argument("--num_workers", type=int, default=3)
  p.add_argument("--steps", type=int, default=80)
  p.add_argument("--checkpoint_every", type=int, default=10)
  p.add_argument("--collective_timeout", type=float, default=15.0,
                 help="runtime.timeout_seconds of both runs; a hang holds "
                 "its worker at least this long, then until the launcher "
                 "reports a failure, at most 3x this.")
  p.add_argument("--timeout", type=float, default=1800.0,
                 help="Stop a run that takes longer than this (seconds).")
  return p


def check(args) -> list:
  """Checks the arguments; returns the plan. Raises BadInput."""
  common.refuse_run_keys(args.override, RUN_KEYS)
  config = common.load_config(args.config, args.override)
  for flag, value, least in (("--faults", args.faults, 1),
                             ("--num_workers", args.num_workers, 2),
                             ("--checkpoint_every", args.checkpoint_every, 2),
                             ("--collective_timeout",
                              args.collective_timeout, 1)):
    if value < least:
      raise BadInput(f"{flag}={value} must be >= {least}.")
  batch = config.train.global_batch_size
  if batch % args.num_workers:
    raise BadInput(
        f"train.global_batch_size={batch} is not divisible by the "
        f"{args.num_workers} workers; pass --override=train.global_batch_size"
        f"={batch - batch % args.num_workers or args.num_workers}.")
  kinds = args.kinds.split(",")
  if not kinds or not set(kinds) <= set(chaos_plan.KINDS):
    raise BadInput(f"--kinds={args.kinds!r} must be comma-separated kinds "
                   f"of {', '.join(chaos_plan.KINDS)}.")
  common.require_empty("--workdir", args.workdir)
  return chaos_plan.make(args.seed, args.faults, args.num_workers, args.steps,
                         args.checkpoint_every, kinds)


def command(args, workdir: str) -> list[str]:
  """The worker command: the config and overrides, then the tool's keys."""
  return [sys.executable, "-m", "dist_keras.train",
          f"--config={common.child_spec(args.config)}",
          f"--workdir={workdir}", *[f"--config.{o}" for o in args.override],
          f"--config.train.steps={args.steps}",
          f"--config.train.checkpoint_every={args.checkpoint_every}",
          "--config.train.log_every=1", "--config.log.progress=true",
          f"--config.runtime.timeout_seconds={args.collective_timeout}",
          "--config.log.calibration_steps=0"]


def run(args, name: str, plan) -> chaos_run.Result:
  """One run into WORKDIR/name, its launcher's lines in WORKDIR/name.log."""
  root = os.path.abspath(args.workdir)
  print(f"{name} run: {len(plan)} fault(s), log {root}/{name}.log",
        flush=True)
  return chaos_run.run(
      command(args, os.path.join(root, name)), args.num_workers, plan,
      os.path.join(root, f"{name}.log"),
      (args.collective_timeout, 3 * args.collective_timeout),
      args.timeout)


def compare(reference: str, chaos: str) -> tuple[bool, str]:
  """Whether the final model.keras (or model.weights.h5) weights and the
  final checkpoint's model and optimizer variables of two workdirs are
  bitwise equal; one line."""
  # pylint: disable=g-import-not-at-top
  import numpy as np

  from dist_keras import quiet
  with quiet.startup_lines_filtered():
    import keras
    import tensorflow as tf
  pairs = list(zip(*(_final_weights(d, keras) for d in (reference, chaos))))
  readers = [tf.train.load_checkpoint(os.path.join(d, "checkpoints"))
             for d in (reference, chaos)]
  names = sorted(n for n in readers[0].get_variable_to_shape_map()
                 if n.startswith(("model_variables/", "optimizer_variables/",
                                  "step/")))
  tensors = [(readers[0].get_tensor(n), readers[1].get_tensor(n))
             for n in names]
  diffs = [float(np.max(np.abs(a.astype(np.float64) - b), initial=0))
           for a, b in pairs + tensors]
  equal = all(a.tobytes() == b.tobytes() for a, b in pairs + tensors)
  return equal, (
      f"max|diff| {max(diffs[:len(pairs)]):g} over {len(pairs)} "
      f"{_saved_name(reference)} weights, {max(diffs[len(pairs):]):g} over {len(tensors)} final "
      "checkpoint tensors (optimizer state included): "
      + ("bitwise equal" if equal else "NOT bitwise equal"))


def _saved_name(workdir: str) -> str:
  """The file the run saved its model in: model.keras, or model.weights.h5
  for a model Keras cannot save whole."""
  whole = os.path.exists(os.path.join(workdir, "model.keras"))
  return "model.keras" if whole else "model.weights.h5"


def _final_weights(workdir: str, keras) -> list:
  """The saved model's weights: model.keras's, or every array of
  model.weights.h5 in the order of their paths."""
  path = os.path.join(workdir, _saved_name(workdir))
  if path.endswith(".keras"):
    return keras.models.load_model(path, compile=False).get_weights()
  import h5py  # pylint: disable=g-import-not-at-top
  arrays = []
  with h5py.File(path, "r") as saved:
    saved.visititems(lambda _, item: arrays.append(item[()]) if isinstance(
        item, h5py.Dataset) else None)
  return arrays


def failure(args, plan, result) -> str | None:
  """Why the chaos run failed, before its weights are compared, or None."""
  if result.code:
    return (f"the chaos run {'timed out and ' if result.timed_out else ''}"
            f"exited {result.code}; its log: "
            f"{os.path.abspath(args.workdir)}/chaos.log")
  survived = sum(o.survived for o in result.chaos.outcomes)
  if survived < len(plan):
    return f"{survived} of {len(plan)} planned faults injected and survived"
  return None


def main(argv=None) -> int:
  try:
    args = parser().parse_args(argv)
    if args.seed is None:
      args.seed = random.SystemRandom().randrange(10**6)
    plan = check(args)
  except BadInput as e:
    return common.fail(PROG, e)
  print(f"chaos: seed {args.seed}, {args.faults} fault(s) into "
        f"{args.num_workers} workers, {args.steps} steps, checkpoint every "
        f"{args.checkpoint_every}, collective timeout "
        f"{args.collective_timeout:g} s; rerun with --seed={args.seed}")
  print("\n".join(chaos_plan.lines(plan)), flush=True)
  os.makedirs(args.workdir, exist_ok=True)
  reference = run(args, "reference", [])
  if reference.code:
    common.say(PROG, f"failed: the uninterrupted run exited {reference.code}"
               f"; its log: {os.path.abspath(args.workdir)}/reference.log")
    return 1
  result = run(args, "chaos", plan)
  why = failure(args, plan, result)
  equal, weights = (False, "not compared") if why else compare(
      *(os.path.join(args.workdir, n) for n in ("reference", "chaos")))
  print("\n".join(chaos_report.table(result.chaos.outcomes)))
  print("\n".join(chaos_report.totals(result, reference.seconds, len(plan),
                                      weights)), flush=True)
  why = why or (None if equal else "the final weights differ")
  if why:
    common.say(PROG, f"failed: {why}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
