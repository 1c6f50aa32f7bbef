"""The scaling sweep's report: its figures and the table it prints.

tools/scaling.py runs the points; this module turns their summary.json
figures into what the sweep reports: per point the medians, speedup and
scaling efficiency (results) and the printed table (format_table). The
definitions are in scaling.py's docstring.

A point is a scaling.Point, of which only attributes are read: this module
does not import scaling.py, which imports it.
"""
import statistics

SUMMARY_KEYS = ("examples_per_sec", "replicas", "sync_fraction",
                "allreduce_ms", "straggler_ms", "compute_ms", "input_wait_ms",
                "step_ms")
BREAKDOWN_KEYS = SUMMARY_KEYS[2:]


# ---- results (pure) ----------------------------------------------------------


def median_or_none(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def point_row(point, summaries: list[dict]) -> dict:
  """One point's figures: medians over its successful runs' summaries."""
  rates = [s["examples_per_sec"] for s in summaries]
  row = {"point": point.name, "strategy": point.strategy,
         "replicas": point.replicas, "workers": point.workers,
         "global_batch_size": point.global_batch,
         "per_replica_batch": point.per_replica_batch,
         "cores": [list(c) for c in point.cores],
         "runs_ok": len(summaries)}
  row["examples_per_sec"] = median_or_none(rates)
  row["examples_per_sec_min"] = min(rates) if rates else None
  row["examples_per_sec_max"] = max(rates) if rates else None
  row["examples_per_sec_runs"] = rates
  for key in BREAKDOWN_KEYS:
    row[key] = median_or_none(s.get(key) for s in summaries)
  return row


def baseline_rate(rows: list[dict]) -> float | None:
  """examples/s of the 1-replica, 1-process point, if it has any."""
  for row in rows:
    if row["replicas"] == 1 and row["workers"] == 1:
      return row["examples_per_sec"]
  return None


def efficiency(rate, replicas: int, baseline) -> tuple[float | None, ...]:
  """(speedup, efficiency) of `rate` at `replicas` against `baseline`."""
  if rate is None or not baseline:
    return None, None
  speedup = rate / baseline
  return speedup, speedup / replicas


def results(points: list, summaries: dict) -> list[dict]:
  """Rows of the table: per point its medians, speedup and efficiency.

  Args:
    points: the sweep's points.
    summaries: {point name: [summary.json dicts of its successful runs]}.
  """
  rows = [point_row(p, summaries.get(p.name, [])) for p in points]
  baseline = baseline_rate(rows)
  for row in rows:
    rate = row["examples_per_sec"]
    row["examples_per_sec_per_replica"] = (
        rate / row["replicas"] if rate is not None else None)
    row["speedup"], row["scaling_efficiency"] = efficiency(
        rate, row["replicas"], baseline)
  return rows


def _fmt(value, spec: str, width: int) -> str:
  return f"{'-' if value is None else format(value, spec):>{width}}"


def format_table(rows: list[dict]) -> str:
  """The results as an aligned text table (times in ms, medians)."""
  spread = any(r["runs_ok"] > 1 for r in rows)
  head = (f"{'point':<12}{'replicas':>9}{'batch':>7}{'ex/s':>9}"
          f"{'ex/s/rep':>9}{'speedup':>8}{'effic.':>7}{'step':>7}"
          f"{'compute':>8}{'input':>6}{'strag.':>7}{'allred':>7}{'sync':>6}"
          + (f"{'spread':>8}" if spread else ""))
  lines = [head]
  for r in rows:
    rate = r["examples_per_sec"]
    line = (f"{r['point']:<12}{r['replicas']:>9}{r['global_batch_size']:>7}"
            + _fmt(rate, ",.0f", 9)
            + _fmt(r["examples_per_sec_per_replica"], ",.0f", 9)
            + _fmt(r["speedup"], ".2f", 8)
            + _fmt(r["scaling_efficiency"], ".0%", 7)
            + _fmt(r["step_ms"], ".1f", 7) + _fmt(r["compute_ms"], ".1f", 8)
            + _fmt(r["input_wait_ms"], ".1f", 6)
            + _fmt(r["straggler_ms"], ".1f", 7)
            + _fmt(r["allreduce_ms"], ".2f", 7)
            + _fmt(r["sync_fraction"], ".0%", 6))
    if spread:
      width = ((r["examples_per_sec_max"] - r["examples_per_sec_min"]) / rate
               if rate else None)
      line += _fmt(width, ".0%", 8)
    lines.append(line + ("" if rate is not None else "  (failed)"))
  return "\n".join(lines)
