"""Predicted step time, speedup and scaling efficiency of data parallelism.

From one replica's compute time per step and the bytes of gradient it
all-reduces, predicts what N devices would give over typical links, with the
ring all-reduce cost model of dist_keras/measure/costmodel.py. A planning
tool, not a test: it prints figures.

Model: weak scaling (the per-replica batch is fixed, so the global batch grows
with N), and NO overlap of compute and communication: each step computes,
then all-reduces the whole gradient as one message. So

  step = compute + allreduce(N, gradient_bytes) + allgather(N, gathered_bytes)
  efficiency = compute / step,   speedup = N * efficiency

(gathered_bytes: an Embedding's gradient slices, which TensorFlow
all-gathers rather than all-reduces; a run's summary.json records both.)

Overlapping the all-reduce with the backward pass, as bucketed all-reduce
does, would do better; these figures are the pessimistic bound.

  python tools/scaling_model.py --compute_ms=40 --gradient_bytes=100e6
  python tools/scaling_model.py --workdir=runs/20261129-231659 --preset=pcie4
  python tools/scaling_model.py --compute_ms=40 --gradient_bytes=1e8 \\
      --bandwidth_gbps=3.8 --latency_us=72 --json=/tmp/scaling.json
"""
import json
import math
import sys

import common
from common import BadInput

from dist_keras.measure import costmodel

# Nominal planning figures, not measurements: bus bandwidth (NCCL busbw sense,
# GB/s = 1e9 bytes/s) and per-step latency of each link class. Calibrate on
# the real machine (costmodel.calibrate) and pass --bandwidth_gbps and
# --latency_us for figures you can trust.
PRESETS = {
    "nvlink": {"label": "NVLink-class", "bandwidth_gbps": 150.0,
               "latency_us": 5.0},
    "pcie4": {"label": "PCIe 4 x16", "bandwidth_gbps": 12.0,
              "latency_us": 10.0},
    "25gbe": {"label": "25 GbE", "bandwidth_gbps": 2.5, "latency_us": 30.0},
    "100gbe": {"label": "100 GbE", "bandwidth_gbps": 10.0,
               "latency_us": 20.0},
}
DEFAULT_DEVICES = "1,2,4,8,16,32,64"
PROG = "scaling_model"


def parse_args(argv=None):
  p = common.Parser(prog="scaling_model.py",
                    description=__doc__.splitlines()[0])
  p.add_argument("--compute_ms", type=float,
                 help="One replica's compute time per step, ms (overrides "
                 "--workdir's).")
  p.add_argument("--gradient_bytes", type=float,
                 help="Bytes of gradient each replica all-reduces per step "
                 "(overrides --workdir's).")
  p.add_argument("--gathered_bytes", type=float,
                 help="Bytes of Embedding gradient slices (and their "
                 "indices) each replica all-gathers per step (default: "
                 "--workdir's, else 0).")
  p.add_argument("--workdir",
                 help="A dist_keras run folder: read compute_ms and "
                 "gradient_bytes from its summary.json.")
  p.add_argument("--devices", default=DEFAULT_DEVICES,
                 help="Comma-separated device counts (default %(default)s).")
  p.add_argument("--preset", default=",".join(PRESETS),
                 help="Comma-separated link presets: "
                 f"{', '.join(PRESETS)} (default: all).")
  p.add_argument("--bandwidth_gbps", type=float,
                 help="A custom link's bus bandwidth in GB/s (gigaBYTES, "
                 "1e9 bytes/s), used instead of the presets; needs "
                 "--latency_us.")
  p.add_argument("--latency_us", type=float,
                 help="The custom link's latency per ring step, us.")
  p.add_argument("--json", help="Also write the results here as JSON.")
  return p.parse_args(argv)


def model_inputs(args) -> tuple[float, costmodel.Traffic]:
  """(compute_ms, the bytes a replica sends) from the flags, else from
  --workdir."""
  compute_ms, gradient_bytes = args.compute_ms, args.gradient_bytes
  gathered = args.gathered_bytes
  if args.workdir and None in (compute_ms, gradient_bytes, gathered):
    summary = _read_summary(args.workdir)
    if compute_ms is None:
      compute_ms = _summary_value(summary, "compute_ms", args.workdir)
    if gradient_bytes is None:
      gradient_bytes = _summary_value(summary, "gradient_bytes", args.workdir)
    if gathered is None and "gathered_bytes" in summary:
      gathered = _summary_value(summary, "gathered_bytes", args.workdir)
  if compute_ms is None or gradient_bytes is None:
    raise BadInput("need --compute_ms and --gradient_bytes, or --workdir of a "
                   "dist_keras run.")
  if not (math.isfinite(compute_ms) and compute_ms > 0):
    raise BadInput(f"compute_ms={compute_ms!r} must be > 0; pass one "
                   "replica's compute time per step in ms.")
  if not (math.isfinite(gradient_bytes) and gradient_bytes > 0):
    raise BadInput(f"gradient_bytes={gradient_bytes!r} must be > 0; pass the "
                   "bytes of gradient one replica all-reduces.")
  if not (math.isfinite(gathered or 0) and (gathered or 0) >= 0):
    raise BadInput(f"gathered_bytes={gathered!r} must be >= 0.")
  return compute_ms, costmodel.Traffic(gradient_bytes, gathered or 0)


def _read_summary(workdir: str) -> dict:
  try:
    return common.read_summary(workdir)
  except ValueError as e:
    raise BadInput(f"--workdir={workdir}: {e}; pass a finished dist_keras "
                   "run.") from None


def _summary_value(summary: dict, key: str, workdir: str) -> float:
  value = summary.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    why = "has no" if key not in summary else f"has a non-numeric ({value!r})"
    raise BadInput(f"{workdir}/summary.json {why} {key!r} key; rerun with a "
                   f"dist_keras that records it, or pass --{key}.")
  return float(value)


def links(args) -> dict:
  """{name: {label, bandwidth_gbps, latency_us}} of the links to model."""
  if args.bandwidth_gbps is not None or args.latency_us is not None:
    if args.bandwidth_gbps is None or args.latency_us is None:
      raise BadInput("--bandwidth_gbps and --latency_us go together; pass "
                     "both, or neither to use the presets.")
    if not (math.isfinite(args.bandwidth_gbps) and args.bandwidth_gbps > 0):
      raise BadInput(f"--bandwidth_gbps={args.bandwidth_gbps!r} must be > 0.")
    if not (math.isfinite(args.latency_us) and args.latency_us >= 0):
      raise BadInput(f"--latency_us={args.latency_us!r} must be >= 0.")
    return {"custom": {"label": "custom link",
                       "bandwidth_gbps": args.bandwidth_gbps,
                       "latency_us": args.latency_us}}
  names = [n.strip() for n in args.preset.split(",") if n.strip()]
  unknown = [n for n in names if n not in PRESETS]
  if unknown or not names:
    raise BadInput(f"--preset={args.preset!r}: unknown preset "
                   f"{', '.join(map(repr, unknown)) or '(none given)'}; use "
                   f"{', '.join(PRESETS)}.")
  return {n: PRESETS[n] for n in names}


def device_counts(text: str) -> list[int]:
  try:
    counts = [int(n) for n in text.split(",")]
  except ValueError:
    counts = []
  if not counts or min(counts) < 1:
    raise BadInput(f"--devices={text!r} must be comma-separated integers "
                   ">= 1, e.g. {DEFAULT_DEVICES}.")
  return counts


def predict(compute_ms, traffic, link, counts) -> list[dict]:
  """One row per device count: all-reduce (and all-gather) and step ms,
  speedup, efficiency."""
  alpha, bandwidth = link["latency_us"] * 1e-6, link["bandwidth_gbps"] * 1e9
  rows = []
  for n in counts:
    row = {"devices": n, "allreduce_ms": 1e3 * costmodel.allreduce_seconds(
        n, traffic.allreduced, alpha, bandwidth)}
    if traffic.gathered:
      row["allgather_ms"] = 1e3 * costmodel.allgather_seconds(
          n, traffic.gathered, alpha, bandwidth)
    # No overlap: communication waits.
    step_ms = compute_ms + row["allreduce_ms"] + row.get("allgather_ms", 0)
    efficiency = compute_ms / step_ms
    rows.append({**row, "step_ms": step_ms, "speedup": n * efficiency,
                 "efficiency": efficiency})
  return rows


def print_table(link, rows) -> None:
  print(f"{link['label']}: bus bandwidth {link['bandwidth_gbps']:g} GB/s, "
        f"latency {link['latency_us']:g} us per ring step")
  gathers = "allgather_ms" in rows[0]
  print(f"{'devices':>7} {'allreduce ms':>12} "
        + (f"{'allgather ms':>12} " if gathers else "")
        + f"{'step ms':>10} {'speedup':>8} {'efficiency':>10}")
  for r in rows:
    print(f"{r['devices']:>7} {r['allreduce_ms']:>12.3f} "
          + (f"{r['allgather_ms']:>12.3f} " if gathers else "")
          + f"{r['step_ms']:>10.3f} {r['speedup']:>8.2f} "
          f"{r['efficiency']:>10.1%}")
  print()


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
    compute_ms, traffic = model_inputs(args)
    chosen = links(args)
    counts = device_counts(args.devices)
  except BadInput as e:
    return common.fail(PROG, e)
  gathered = (f", {traffic.gathered:,.0f} gathered (ring all-gather)"
              if traffic.gathered else "")
  print(f"compute {compute_ms:g} ms per replica step, "
        f"{traffic.allreduced:,.0f} gradient bytes (ring all-reduce)"
        f"{gathered}; weak scaling, no compute/communication overlap\n")
  results = {}
  for name, link in chosen.items():
    rows = predict(compute_ms, traffic, link, counts)
    print_table(link, rows)
    results[name] = dict(link, rows=rows)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"compute_ms": compute_ms,
                 "gradient_bytes": traffic.allreduced,
                 "gathered_bytes": traffic.gathered,
                 "model": "ring all-reduce (and all-gather of slices), weak "
                 "scaling, no overlap",
                 "links": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
