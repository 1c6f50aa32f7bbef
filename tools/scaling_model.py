"""Predicted step time, speedup and scaling efficiency of data parallelism.

From one replica's compute time per step and the bytes of gradient it
all-reduces, predicts what N devices would give over typical links, with the
ring all-reduce cost model of dist_keras/measure/costmodel.py. A planning
tool, not a test: it prints figures.

Model: weak scaling (the per-replica batch is fixed, so the global batch grows
with N), and NO overlap of compute and communication: each step computes,
then all-reduces the whole gradient as one message. So

  step = compute + allreduce(N, gradient_bytes)
  efficiency = compute / step,   speedup = N * efficiency

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


def model_inputs(args) -> tuple[float, float]:
  """(compute_ms, gradient_bytes) from the flags, else from --workdir."""
  compute_ms, gradient_bytes = args.compute_ms, args.gradient_bytes
  if args.workdir and (compute_ms is None or gradient_bytes is None):
    summary = _read_summary(args.workdir)
    if compute_ms is None:
      compute_ms = _summary_value(summary, "compute_ms", args.workdir)
    if gradient_bytes is None:
      gradient_bytes = _summary_value(summary, "gradient_bytes", args.workdir)
  if compute_ms is None or gradient_bytes is None:
    raise BadInput("need --compute_ms and --gradient_bytes, or --workdir of a "
                   "dist_keras run.")
  if not (math.isfinite(compute_ms) and compute_ms > 0):
    raise BadInput(f"compute_ms={compute_ms!r} must be > 0; pass one "
                   "replica's compute time per step in ms.")
  if not (math.isfinite(gradient_bytes) and gradient_bytes > 0):
    raise BadInput(f"gradient_bytes={gradient_bytes!r} must be > 0; pass the "
                   "bytes of gradient one replica all-reduces.")
  return compute_ms, gradient_bytes


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


def predict(compute_ms, gradient_bytes, link, counts) -> list[dict]:
  """One row per device count: all-reduce and step ms, speedup, efficiency."""
  rows = []
  for n in counts:
    comm_ms = 1e3 * costmodel.allreduce_seconds(
        n, gradient_bytes, link["latency_us"] * 1e-6,
        link["bandwidth_gbps"] * 1e9)
    step_ms = compute_ms + comm_ms  # No overlap: communication waits.
    efficiency = compute_ms / step_ms
    rows.append({"devices": n, "allreduce_ms": comm_ms, "step_ms": step_ms,
                 "speedup": n * efficiency, "efficiency": efficiency})
  return rows


def print_table(link, rows) -> None:
  print(f"{link['label']}: bus bandwidth {link['bandwidth_gbps']:g} GB/s, "
        f"latency {link['latency_us']:g} us per ring step")
  print(f"{'devices':>7} {'allreduce ms':>12} {'step ms':>10} "
        f"{'speedup':>8} {'efficiency':>10}")
  for r in rows:
    print(f"{r['devices']:>7} {r['allreduce_ms']:>12.3f} {r['step_ms']:>10.3f}"
          f" {r['speedup']:>8.2f} {r['efficiency']:>10.1%}")
  print()


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
    compute_ms, gradient_bytes = model_inputs(args)
    chosen = links(args)
    counts = device_counts(args.devices)
  except BadInput as e:
    return common.fail(PROG, e)
  print(f"compute {compute_ms:g} ms per replica step, {gradient_bytes:,.0f} "
        "gradient bytes; weak scaling, no compute/communication overlap, "
        "ring all-reduce\n")
  results = {}
  for name, link in chosen.items():
    rows = predict(compute_ms, gradient_bytes, link, counts)
    print_table(link, rows)
    results[name] = dict(link, rows=rows)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"compute_ms": compute_ms, "gradient_bytes": gradient_bytes,
                 "model": "ring all-reduce, weak scaling, no overlap",
                 "links": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
