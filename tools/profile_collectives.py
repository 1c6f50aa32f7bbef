"""Collective ms per step from a run's profiler trace, beside its sync scalars.

An independent cross-check of the loop's own all-reduce timing: reads the
TensorFlow profiler trace(s) a run wrote with
--config.log.profile_steps=START,STOP and prints, per trace, the time the
replicas spent in collective ops per step (split into waiting for the last
replica and the reduction after everyone arrived), then the run's
`sync/allreduce_ms` and `sync/straggler_ms` TensorBoard scalars over the same
steps, and their ratio to the trace's figures. Under multi-worker the
trace is this process's replicas only, while sync/straggler_ms is the job's
(every worker's replicas): that one is shown, not compared. The sync
timing's own all_gather (each replica's collective wait and compute,
gathered after the step's last stamp: dist_keras/measure/stamps.py) is left out of the trace's figures, as
the scalars leave it out; how many executions that was is printed.

  python tools/profile_collectives.py --workdir runs/20261129-231659

Exit 2: no trace under --workdir.
"""
import json
import os
import sys
import tempfile

import common

from dist_keras.measure import trace

PROG = "profile_collectives"

# TensorFlow builds ReplicaContext.all_gather's nodes under an "allgather"
# name scope (CollectiveAllReduce._batch_all_gather, under Mirrored and
# MultiWorkerMirrored). dist_keras's step calls all_gather only for the sync
# timing's stamps; an Embedding's gradient slices are gathered by the
# IndexedSlices all-reduce, whose nodes are not in that scope
# ("CollectiveGatherV2", "cond/then/_N/cond/CollectiveGatherV2"). The
# stamps' gather runs after the step's last stamp, so no sync scalar times
# it: the trace's figures must not count it either.
STAMPS_SCOPE = "allgather"

# {scalar tag: [(the trace figure it is compared with, its label)]}: what
# the loop's scalars include is its own definition, so both candidates show.
COMPARISONS = {
    "sync/allreduce_ms": [("ms_per_step", "collective ms incl. wait"),
                          ("after_arrival_ms_per_step", "after-arrival ms")],
    "sync/straggler_ms": [("arrival_spread_ms_per_step", "arrival spread"),
                          ("wait_ms_per_step", "mean wait")],
}


def parse_args(argv=None):
  p = common.Parser(prog="profile_collectives.py",
                    description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True,
                 help="The run's --workdir (holds plugins/profile/).")
  p.add_argument("--num_steps", type=int,
                 help="Divide by this many steps instead of counting the "
                      "trace's step markers.")
  p.add_argument("--json", action="store_true",
                 help="Print the parsed figures as JSON instead.")
  return p.parse_args(argv)


def is_stamps_gather(event_name: str) -> bool:
  """Whether a trace event is an execution of the sync timing's all_gather."""
  node, _, op_type = event_name.rpartition(":")
  return (op_type in trace.COLLECTIVE_OPS
          and STAMPS_SCOPE in node.split("/")[:-1])


def without_stamps_gathers(path: str, folder: str) -> tuple[str, dict]:
  """(a copy of the trace in `folder` without the stamps' all_gather
  executions, {op type: executions left out})."""
  space = trace.load_xspace(path)
  left_out = {}
  for plane in space.planes:
    names = {k: m.name for k, m in plane.event_metadata.items()}
    for line in plane.lines:
      keep = []
      for event in line.events:
        name = names.get(event.metadata_id, "")
        if is_stamps_gather(name):
          op_type = name.rpartition(":")[2]
          left_out[op_type] = left_out.get(op_type, 0) + 1
        else:
          keep.append(event)
      if len(keep) < len(line.events):
        del line.events[:]
        line.events.extend(keep)
  copy = os.path.join(folder, "trace.xplane.pb")
  with open(copy, "wb") as f:
    f.write(space.SerializeToString())
  return copy, left_out


def cross_check(path: str, num_steps) -> dict:
  """collective_ms_per_step of the trace at `path`, the stamps' all_gather
  left out (`stamps_gathers_left_out`: {op type: executions})."""
  with tempfile.TemporaryDirectory() as folder:
    copy, left_out = without_stamps_gathers(path, folder)
    result = trace.collective_ms_per_step(copy, num_steps)
  result["trace"] = path
  result["stamps_gathers_left_out"] = left_out
  return result


def profiled_range(result: dict, workdir: str):
  """(first, last) profiled step: the trace's markers, else config.json."""
  if result["step_nums"]:
    return result["step_nums"][0], result["step_nums"][-1]
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      start, stop = json.load(f)["log"]["profile_steps"].split(",")
    return int(start), int(stop)
  except (OSError, KeyError, TypeError, ValueError):
    return None


def scalar_over(points, steps_range):
  """(mean value, note) of a scalar over the profiled steps.

  Scalars are logged every train.log_every steps, each averaging the steps
  since the previous point; with no point inside the range, the first one
  after it covers the profiled steps.
  """
  if steps_range is None:
    return (sum(v for _, v in points) / len(points),
            f"all {len(points)} points: profiled steps unknown")
  first, last = steps_range
  inside = [v for s, v in points if first <= s <= last]
  if inside:
    return sum(inside) / len(inside), f"{len(inside)} point(s) in range"
  after = [(s, v) for s, v in points if s > last]
  if after:
    return after[0][1], f"logged at step {after[0][0]}, after the range"
  return None, "no point at or after the profiled steps"


def _ms(value) -> str:
  return "n/a" if value is None else f"{value:.3f}"


def print_trace(result: dict) -> None:
  ops = ", ".join(f"{n} {t}" for t, n in sorted(result["op_types"].items()))
  steps = {trace.GIVEN: "given by --num_steps",
           trace.FUNCTION_RUNS: "one per function run: no step markers"
          }.get(result["step_source"], "")
  if result["step_nums"]:
    steps = (f"step markers {result['step_nums'][0]}-"
             f"{result['step_nums'][-1]}")
  print(f"trace {result['trace']}")
  print(f"  {result['replicas']} replicas; {ops or 'no collective ops'}; "
        f"{result['steps']} steps ({steps})")
  left_out = result["stamps_gathers_left_out"]
  if left_out:
    counts = ", ".join(f"{n} {t}" for t, n in sorted(left_out.items()))
    print(f"  note: {counts} of the sync timing's own all_gather (nodes under "
          f"{STAMPS_SCOPE}/, after the step's last stamp) left out, as the "
          "scalars leave it out")
  for key, note in (("incomplete", "all-reduce(s) cut off by the profiler"),
                    ("outside_steps", "execution(s) outside the steps, "
                                      "left out")):
    if result[key]:
      print(f"  note: {result[key]} {note}")
  if result["dropped_steps"]:
    print(f"  note: steps {result['dropped_steps']} left out: their "
          "all-reduce was cut off by the profiler's stop")
  rows = (("collective ms per step, mean over replicas", "ms_per_step"),
          ("  waiting for the last replica to arrive", "wait_ms_per_step"),
          ("  after all replicas arrived", "after_arrival_ms_per_step"),
          ("arrival spread (last - first replica) ms/step",
           "arrival_spread_ms_per_step"))
  for label, key in rows:
    print(f"  {label:<47} {_ms(result[key]):>9}")
  if result["step_ms"] and result["ms_per_step"] is not None:
    print(f"  {'step wall time (step markers) ms':<47} "
          f"{_ms(result['step_ms']):>9}  (collective "
          f"{result['ms_per_step'] / result['step_ms']:.1%}, after arrival "
          f"{result['after_arrival_ms_per_step'] / result['step_ms']:.1%})")
  for name, r in result["per_replica"].items():
    print(f"  {name}: {_ms(r['ms_per_step'])} ms/step, of which wait "
          f"{_ms(r['wait_ms_per_step'])} ({r['executions']} executions)")


def job_replicas(workdir: str, scalars: dict):
  """The run's replicas in sync, every worker's: summary.json's, else one
  per sync_replica/<i>/compute_ms tag (the chief logs every replica's);
  None if neither says."""
  try:
    return int(common.read_summary(workdir)["replicas"])
  except (ValueError, KeyError, TypeError):
    tags = [t for t in scalars if t.startswith("sync_replica/")
            and t.endswith("/compute_ms")]  # (Each replica has several.)
    return len(tags) or None


# Scalars that are the job's, every worker's replicas, under multi-worker.
JOB_WIDE = ("sync/straggler_ms",)


def print_scalars(result: dict, scalars: dict, steps_range,
                  replicas=None) -> None:
  """The scalars over the profiled steps beside the trace's figures;
  `replicas` the job's (job_replicas): more than the trace's means other
  workers' replicas, whose collectives are in their own traces."""
  where = (f"steps {steps_range[0]}-{steps_range[1]}" if steps_range
           else "all steps")
  print(f"  TensorBoard scalars over {where}:")
  others = bool(replicas and result["replicas"]
                and replicas > result["replicas"])
  if others:
    print(f"    note: this trace holds {result['replicas']} of the job's "
          f"{replicas} replicas (other workers' are in their own traces): "
          "its wait, after-arrival and arrival spread see only their "
          "arrivals")
  for tag, figures in COMPARISONS.items():
    if tag not in scalars:
      print(f"    {tag:<18} not in this workdir's scalars (this loop does "
            "not log it); nothing to compare")
      continue
    value, note = scalar_over(scalars[tag], steps_range)
    print(f"    {tag:<18} {_ms(value):>9}  ({note})")
    if others and tag in JOB_WIDE:
      print(f"      not compared: the job's, over its {replicas} replicas, "
            "not this trace's")
      continue
    for key, label in figures:
      if value is not None and result[key]:
        print(f"      = {value / result[key]:.2f}x the trace's {label} "
              f"{_ms(result[key])}")


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
    paths = trace.find_traces(args.workdir)
    if not paths:
      raise common.BadInput(
          f"no profiler trace (*.xplane.pb) under {args.workdir}; train with "
          "--config.log.profile_steps=START,STOP to write one.")
  except common.BadInput as e:
    return common.fail(PROG, e)
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  # TensorFlow, imported here (reading the trace imports it too): seconds
  # that --help need not wait, and its start-up lines filtered.
  with quiet.startup_lines_filtered():
    from dist_keras import tensorboard_events  # pylint: disable=g-import-not-at-top
  results = [cross_check(p, args.num_steps) for p in paths]
  if args.json:
    print(json.dumps(results, indent=2))
    return 0
  scalars = tensorboard_events.read_scalars(args.workdir)
  for result in results:
    print_trace(result)
    print_scalars(result, scalars, profiled_range(result, args.workdir),
                  job_replicas(args.workdir, scalars))
  return 0


if __name__ == "__main__":
  sys.exit(main())
