"""The sync breakdown: one step split into input wait, compute, straggler
wait and all-reduce, from the stamps of measure/stamps.py; and its log."""
import numpy as np


def split_step(step_start: float, inputs_ready: float, stamps,
              job_durations=None) -> dict:
  """Splits one step into input wait, compute, straggler wait and all-reduce.

  Args:
    step_start: host stamp before asking for the next distributed batch.
    inputs_ready: stamp once every replica's batch is there.
    stamps: [local replicas, 4] array of STAMPS per replica, in seconds.
    job_durations: [replicas in sync, 5] rows of stamps.durations_row,
      EVERY replica of the job's; default: local.

  Returns:
    Milliseconds (mean and max over the local replicas; per replica, the four
    parts add up to its step time exactly) and `fraction`, the share of
    this worker's step its replicas spent in the reduction (at most 1; not
    the job's straggler wait, below, which may span host work between
    steps). A replica's time
    in the reduction is straggler wait (until the last replica has its
    gradients) plus all-reduce. When every replica is local, one clock
    says when the last one arrived. When some are on other hosts, whose
    clocks differ, only durations are compared: the replica that arrives
    last waits for no one, so the shortest time in the reduction is the
    all-reduce proper and a replica's excess over it is straggler wait
    (this assumes the replicas finish the reduction together). There
    the straggler wait and the per-replica lists are EVERY replica's of the
    job, as on one host (a worker whose replicas
    are the slowest waits for no one, yet the job's others wait for them),
    so the means add up to the step only where this worker's replicas wait
    as long as the job's; so are `outside_max_ms` and `callbacks_max_ms`.
  """
  start, ready, reduced, end = np.asarray(stamps, dtype=np.float64).T
  waits = reduced - ready
  across_hosts = (job_durations is not None
                  and len(job_durations) != len(start))
  if across_hosts:  # Replicas on other hosts, other clocks: durations only.
    job = np.asarray(job_durations, np.float64)
    straggler = np.maximum(waits - job[:, 0].min(), 0.0)
  else:  # Every replica is here, on one clock: the last arrival is known.
    straggler = ready.max() - ready
  per_replica = {
      # Until the replica holds its own part of the batch: the host's wait
      # for it plus handing it to the replica.
      "input_wait_ms": np.maximum(start - step_start, 0.0),
      "compute_ms": (ready - start) + (end - reduced),
      "straggler_ms": straggler,
      "allreduce_ms": np.maximum(waits - straggler, 0.0),
  }
  out = {"batch_ready_ms": 1e3 * (inputs_ready - step_start),
         "step_ms": 1e3 * (end.max() - step_start)}
  for name, values in per_replica.items():
    out[name] = 1e3 * float(values.mean())
    out[name.replace("_ms", "_max_ms")] = 1e3 * float(values.max())
    if name in PER_REPLICA:
      out[f"per_replica_{name}"] = (1e3 * values).tolist()
  out["fraction"] = float(waits.mean()) / max(end.max() - step_start, 1e-12)
  if across_hosts:
    out.update(_jobs(job))
  return out


# What each replica's own tags (sync_replica/<i>/NAME) say, from the local
# stamps on one host, from every replica's gathered durations across hosts
# (there also each replica's worker's host time outside the calls).
PER_REPLICA = ("input_wait_ms", "compute_ms")
_GATHERED = ("compute_ms", "input_wait_ms", "outside_ms", "callbacks_ms")


def _jobs(job) -> dict:
  """The job-wide figures of split_step from gathered rows [replicas, 5]:
  the straggler wait's mean and max, every replica's own figures, and the
  worst worker's host time outside the calls."""
  job_straggler = job[:, 0] - job[:, 0].min()
  out = {"straggler_ms": 1e3 * float(job_straggler.mean()),
         "straggler_max_ms": 1e3 * float(job_straggler.max())}
  for column, name in enumerate(_GATHERED, start=1):
    out[f"per_replica_{name}"] = (1e3 * job[:, column]).tolist()
  for name in ("outside_ms", "callbacks_ms"):
    out[name.replace("_ms", "_max_ms")] = max(out[f"per_replica_{name}"])
  return out


def whole_step(step_start: float, inputs_ready: float, stamps) -> dict:
  """Input wait and the rest of a step that cannot be split further (a
  model's own train_step: its all-reduce happens inside the optimizer).

  Args:
    step_start, inputs_ready: as for `breakdown`.
    stamps: [local replicas, 2] array of (start, end) per replica, seconds.

  Returns:
    Milliseconds, mean and max over the local replicas: `input_wait_ms`
    and `model_step_ms` (compute, straggler wait and all-reduce together);
    `step_ms` and `batch_ready_ms` as `breakdown` has them.
  """
  start, end = np.asarray(stamps, dtype=np.float64).T
  per_replica = {"input_wait_ms": np.maximum(start - step_start, 0.0),
                 "model_step_ms": end - start}
  out = {"batch_ready_ms": 1e3 * (inputs_ready - step_start),
         "step_ms": 1e3 * (end.max() - step_start)}
  for name, values in per_replica.items():
    out[name] = 1e3 * float(values.mean())
    out[name.replace("_ms", "_max_ms")] = 1e3 * float(values.max())
  return out


class SyncLog:
  """Breakdowns of the logged steps: TensorBoard values and run averages
  (kept as sums, which a resumed run carries on from its checkpoint's)."""

  COMPONENTS = ("input_wait_ms", "compute_ms", "straggler_ms", "allreduce_ms")
  _HOST = ("outside_ms", "callbacks_ms")  # Host clocks: no timed step.
  _AVERAGED = (*COMPONENTS, "model_step_ms", "step_ms", "fraction", *_HOST)

  def __init__(self, count: int = 0, sums: dict | None = None,
               host_only: int = 0):
    self.count = count  # Steps recorded.
    self.sums = dict(sums or {})  # Their _AVERAGED values, summed.
    # Log windows with no timed step (log.sync_timing off, TPUs) whose
    # _HOST figures are in `sums` too.
    self.host_only = host_only

  def add(self, split: dict) -> dict:
    """Records one step's breakdown; returns its `sync/*` scalars."""
    self.count += 1
    for k in self._AVERAGED:
      if k in split:
        self.sums[k] = self.sums.get(k, 0.0) + float(split[k])
    values = {f"sync/{k}": v for k, v in split.items()
              if not k.startswith("per_replica_")}
    for key, per_replica in split.items():
      if key.startswith("per_replica_"):
        name = key[len("per_replica_"):]
        values.update({f"sync_replica/{i}/{name}": ms
                       for i, ms in enumerate(per_replica)})
    return values

  def add_host(self, host: dict) -> dict:
    """Records the _HOST figures of a log window without a timed step;
    returns their `sync/*` scalars."""
    self.host_only += 1
    for k in self._HOST:
      self.sums[k] = self.sums.get(k, 0.0) + float(host[k])
    return {f"sync/{k}": host[k] for k in self._HOST}

  def means(self) -> dict:
    """Mean of every component over the recorded steps ({} if none; a
    model's own step has input_wait_ms, model_step_ms and step_ms only;
    outside_ms and callbacks_ms also over windows of no timed step)."""
    out = {}
    for k, v in self.sums.items():
      count = self.count + (self.host_only if k in self._HOST else 0)
      if count:
        out[k] = v / count
    return out
