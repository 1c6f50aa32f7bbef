"""Collective-op time read from a TensorFlow profiler trace.

An independent cross-check of the loop's own all-reduce timing:
`tf.profiler.experimental.start(workdir)` / `stop()` writes
`workdir/plugins/profile/<run>/<host>.xplane.pb`, an `XSpace` protobuf
(planes -> lines, one per thread -> timed events; each event names an
`event_metadata` entry and carries `stats`). No TensorBoard plugin is needed
to write or to read it.

What one collective execution is: TensorFlow's collective executor wraps each
member's run of the collective algorithm in a trace event named
"<node name>:<op type>" (e.g. "CollectiveReduceV2_1:CollectiveReduceV2") with
`step_id`, `group_key` and `instance_key` stats. On CPU the ring algorithm
blocks until its peers send their chunks, so that event's duration INCLUDES
waiting for the other replicas to arrive. The members of one all-reduce share
(step_id, group_key, instance_key); the last member's start is when everyone
had arrived, which splits each member's time into straggler wait and the
reduction proper. Not included: resolving the group (blocking only the first
time a group is used) and queueing onto the collective thread pool (tens of
microseconds here).

Which device ran an execution is not in the trace; members are keyed by node
name, which is fixed per replica in a traced function. `collective_devices`
maps those names to devices from the function's graph.
"""
import collections
import glob
import os

# Communication ops only: not group/communicator set-up ops.
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
    "CollectiveReduceScatterV2", "CollectiveGather", "CollectiveGatherV2",
    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "NcclAllReduce", "NcclReduce", "NcclBroadcast",
})
STEP_MARKERS = "step markers"
FUNCTION_RUNS = "function runs"
GIVEN = "num_steps"
_PS_PER_MS = 1e9


def find_traces(logdir: str) -> list[str]:
  """The .xplane.pb files under `logdir`, oldest profiling run first.

  Run folders are named by their start time (YYYY_MM_DD_HH_MM_SS), so sorting
  the paths sorts the runs.
  """
  return sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                          recursive=True))


def load_xspace(xplane_path: str):
  """Parses one .xplane.pb file into an XSpace message."""
  try:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:  # A TensorFlow that moved it; the stand-alone tsl.
    from tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  with open(xplane_path, "rb") as f:
    space.ParseFromString(f.read())
  return space


def collective_devices(graph) -> dict[str, str]:
  """{node name: device} of the collective ops in a traced function's graph.

  E.g. `collective_devices(train_step.get_concrete_function(it).graph)`; pass
  the result as `devices` to `collective_ms_per_step`.
  """
  return {op.name: op.device for op in graph.get_operations()
          if op.type in COLLECTIVE_OPS}


def _stat_value(stat, stat_names):
  kind = stat.WhichOneof("value")
  if kind == "ref_value":  # A string interned in the plane's stat_metadata.
    return stat_names.get(stat.ref_value, "")
  return getattr(stat, kind) if kind else None


def _events(space):
  """Yields (line key, name, start_ps, end_ps, stats) of every event."""
  for p, plane in enumerate(space.planes):
    stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
    for line in plane.lines:
      line_start_ps = line.timestamp_ns * 1000
      for event in line.events:
        start = line_start_ps + event.offset_ps
        stats = {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names)
                 for s in event.stats}
        yield ((p, line.id), plane.event_metadata[event.metadata_id].name,
               start, start + event.duration_ps, stats)


def _scan(space):
  """Collective executions, step markers and step-id carriers, in one pass.

  Step markers are events with a `step_num` stat (`tf.profiler.experimental.
  Trace(name, step_num=n)`). Step-id carriers are events with an `id` or
  `step_id` stat, e.g. "FunctionRun" on the calling thread, whose id is the
  step_id that the function's collectives carry.
  """
  executions, markers, carriers = [], [], []
  for line, name, start, end, stats in _events(space):
    node, _, op_type = name.rpartition(":")
    if op_type in COLLECTIVE_OPS and node:
      step_id = stats.get("step_id", stats.get("id"))
      executions.append({
          "node": node, "op_type": op_type, "start": start, "end": end,
          "step_id": step_id,
          "instance": (step_id, stats.get("group_key"),
                       stats.get("instance_key"), stats.get("iter_id"),
                       stats.get("frame_id"))})
    elif "step_num" in stats:
      markers.append((line, start, end, int(stats["step_num"])))
    elif "id" in stats or "step_id" in stats:
      carriers.append((line, start, stats.get("step_id", stats.get("id"))))
  return executions, markers, carriers


def _assign_steps(executions, markers, carriers) -> None:
  """Sets each execution's "step" to its marker's step_num, or None.

  First by step_id: the marker that holds, on its own thread, the function
  run with the execution's step_id (exact even when kernels run after the
  Python call returns). Else by time: the marker during which it started.
  """
  by_line = collections.defaultdict(list)
  for line, start, end, step_num in markers:
    by_line[line].append((start, end, step_num))
  step_of_id = {}
  for line, t, step_id in carriers:
    for start, end, step_num in by_line.get(line, ()):
      if start <= t <= end:
        step_of_id.setdefault(step_id, step_num)
  for e in executions:
    e["step"] = step_of_id.get(e["step_id"])
    if e["step"] is None:
      e["step"] = next((n for _, start, end, n in markers
                        if start <= e["start"] <= end), None)


def _split_wait(executions) -> tuple[int, int]:
  """Sets "wait" and "after" (ps) of the executions of complete all-reduces.

  wait: from this member's start to the last member's start (straggler wait).
  after: from the last member's start to this member's end. Returns
  (replicas, incomplete instances); a member cut off by the profiler's start
  or stop leaves its instance incomplete, and those get no split.
  """
  instances = collections.defaultdict(list)
  for e in executions:
    instances[e["instance"]].append(e)
  replicas = max((len(m) for m in instances.values()), default=0)
  incomplete = 0
  for members in instances.values():
    if len(members) < replicas:
      incomplete += 1
      continue
    last_arrival = max(e["start"] for e in members)
    first_arrival = min(e["start"] for e in members)
    for e in members:
      e["wait"] = last_arrival - e["start"]
      e["after"] = max(0, e["end"] - last_arrival)
      # How late the last replica was; carried by one member so sums work.
      e["spread"] = 0
    members[0]["spread"] = last_arrival - first_arrival
  return replicas, incomplete


def _per_step(executions, steps: int, replicas: int) -> dict:
  """Collective, wait and after-arrival ms per step, mean over replicas."""
  total = sum(e["end"] - e["start"] for e in executions)
  wait = sum(e["wait"] for e in executions)
  after = sum(e["after"] for e in executions)
  scale = _PS_PER_MS * steps * replicas
  return {"ms_per_step": total / scale, "wait_ms_per_step": wait / scale,
          "after_arrival_ms_per_step": after / scale}


def _spread_per_step(executions, steps: int) -> float:
  """Last minus first arrival at each all-reduce, summed per step, in ms."""
  return sum(e["spread"] for e in executions) / (_PS_PER_MS * steps)


def _mean_marker_ms(markers, step_nums) -> float:
  """Mean wall time of the counted steps, from their markers."""
  spans = {}
  for _, start, end, n in markers:
    first, last = spans.get(n, (start, end))
    spans[n] = (min(first, start), max(last, end))
  return sum(spans[n][1] - spans[n][0] for n in step_nums) / (
      _PS_PER_MS * len(step_nums))


def _select(executions, markers, num_steps):
  """(counted executions, steps, step source, step_nums, dropped steps).

  A step holding an all-reduce that the profiler cut off is dropped whole:
  counting it with part of its collectives would bias the mean low.
  """
  complete = [e for e in executions if "wait" in e]
  if num_steps:
    return complete, num_steps, GIVEN, None, []
  if markers:
    cut = {e["step"] for e in executions if "wait" not in e}
    marked = {m[3] for m in markers}
    step_nums = sorted(marked - cut)
    counted = [e for e in complete if e["step"] in step_nums]
    return (counted, len(step_nums), STEP_MARKERS, step_nums,
            sorted(marked & cut))
  cut = {e["step_id"] for e in executions if "wait" not in e}
  counted = [e for e in complete if e["step_id"] not in cut]
  return (counted, len({e["step_id"] for e in counted}), FUNCTION_RUNS, None,
          [])


def collective_ms_per_step(xplane_path: str, num_steps: int | None = None,
                           devices: dict[str, str] | None = None) -> dict:
  """Time spent in collective ops per training step, from one trace.

  Steps are delimited, in this order of preference: by `num_steps` if given
  (every complete all-reduce in the trace counts); else by step markers
  (`with tf.profiler.experimental.Trace("train", step_num=n, _r=1)` around
  each step; executions outside every marker are left out); else each
  function run (distinct step_id) holding collectives is one step.

  Args:
    xplane_path: a .xplane.pb file (see `find_traces`).
    num_steps: divide by this many steps instead.
    devices: {node name: device} (see `collective_devices`), to key the
      per-replica figures by device instead of node name.

  Returns:
    A dict: `trace`; `op_types` {type: executions}; `executions` (all found);
    `replicas` (members per all-reduce); `incomplete` (all-reduces cut off
    by the profiler's start or stop); `dropped_steps` (marked steps left out
    because they hold one); `outside_steps` (complete executions left out,
    e.g. outside every marker); `steps`, `step_source`, `step_nums` (marker
    numbers counted, or None); `total_ms` (all replicas, counted steps);
    `ms_per_step`, `wait_ms_per_step`, `after_arrival_ms_per_step` (mean over
    replicas; wait + after = ms); `arrival_spread_ms_per_step` (last minus
    first replica's arrival, summed over a step's all-reduces: how late the
    straggler was); `step_ms` (mean marker duration: the step's wall time
    as the calling thread saw it; None without markers); `per_replica`
    {node name or device: the same three and `executions`}; `by_step`
    [{`step`, the same three, `arrival_spread_ms`}] with markers. The
    per-step figures are None when no step was found.
  """
  executions, markers, carriers = _scan(load_xspace(xplane_path))
  replicas, incomplete = _split_wait(executions)
  _assign_steps(executions, markers, carriers)
  counted, steps, source, step_nums, dropped = _select(executions, markers,
                                                       num_steps)
  result = {
      "trace": xplane_path,
      "op_types": dict(collections.Counter(e["op_type"] for e in executions)),
      "executions": len(executions), "replicas": replicas,
      "incomplete": incomplete, "dropped_steps": dropped,
      "outside_steps": (sum(1 for e in executions if "wait" in e)
                        - len(counted)),
      "steps": steps, "step_source": source, "step_nums": step_nums,
      "total_ms": sum(e["end"] - e["start"] for e in counted) / _PS_PER_MS,
      "ms_per_step": None, "wait_ms_per_step": None,
      "after_arrival_ms_per_step": None, "arrival_spread_ms_per_step": None,
      "step_ms": None,
      "per_replica": {}, "by_step": [],
  }
  if not steps or not replicas:
    return result
  result.update(_per_step(counted, steps, replicas))
  result["arrival_spread_ms_per_step"] = _spread_per_step(counted, steps)
  if step_nums:
    result["step_ms"] = _mean_marker_ms(markers, step_nums)
  result.update(_breakdown(counted, steps, replicas, step_nums, devices))
  return result


def _breakdown(counted, steps, replicas, step_nums, devices) -> dict:
  """The `per_replica` and `by_step` figures."""
  by_member = collections.defaultdict(list)
  for e in counted:
    by_member[(devices or {}).get(e["node"], e["node"])].append(e)
  by_step = []
  for n in step_nums or []:
    in_step = [e for e in counted if e["step"] == n]
    by_step.append({"step": n, **_per_step(in_step, 1, replicas),
                    "arrival_spread_ms": _spread_per_step(in_step, 1)})
  # One member: that replica's own time per step, not a mean.
  return {"per_replica": {key: {"executions": len(m),
                                **_per_step(m, steps, 1)}
                          for key, m in sorted(by_member.items())},
          "by_step": by_step}
