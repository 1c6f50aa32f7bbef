"""The scaling sweep's report: its figures, table, files and HParams.

tools/scaling.py runs the points; this module turns their summary.json
figures into what the sweep reports: per point the medians, speedup and
scaling efficiency (results), the printed table (format_table), scaling.png,
written whole or not at all (plot; scaling.py writes scaling.json with
common.write_json), and TensorBoard's HParams tab (write_hparams_config,
write_run_hparams). The definitions are in scaling.py's docstring.

A point is a scaling.Point, of which only attributes are read: this module
does not import scaling.py, which imports it.
"""
import statistics

import common

SUMMARY_KEYS = ("examples_per_sec", "replicas", "sync_fraction",
                "allreduce_ms", "straggler_ms", "compute_ms", "input_wait_ms",
                "step_ms")
BREAKDOWN_KEYS = SUMMARY_KEYS[2:]
# TensorBoard metric tags, written by the tool into each run's logdir.
METRICS = (("scaling/examples_per_sec", "examples/s"),
           ("scaling/examples_per_sec_per_replica", "examples/s per replica"),
           ("scaling/efficiency", "scaling efficiency"),
           ("scaling/sync_fraction", "sync fraction"))


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


# ---- outputs -----------------------------------------------------------------


def plot(report: dict, path: str) -> None:
  """scaling.png: throughput with the ideal line; efficiency, sync fraction."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  rows = [r for r in report["points"] if r["examples_per_sec"] is not None]
  cores = report["host"]["cores"]
  # Replica counts past this share cores (see scaling.Point.oversubscribed).
  fits = cores // (report["cores_per_replica"] or 1)
  baseline = report["baseline_examples_per_sec"]
  fig = Figure(figsize=(12, 4.8), layout="constrained")
  rate_ax, frac_ax = fig.subplots(1, 2)
  xs = sorted({r["replicas"] for r in report["points"]})
  for multi in (False, True):
    group = [r for r in rows if (r["workers"] > 1) == multi]
    if group:
      _plot_group(rate_ax, frac_ax, group, multi)
  if baseline:
    rate_ax.plot(xs, [baseline * n for n in xs], color="gray", ls="--",
                 label="ideal: N x 1 replica")
    frac_ax.axhline(1.0, color="gray", ls="--", lw=1)
  for ax in (rate_ax, frac_ax):
    ax.set_xticks(xs)
    ax.set_xlabel("replicas (logical CPU devices or workers)")
    ax.grid(alpha=0.3)
    if xs and xs[-1] > fits:
      ax.axvspan(fits + 0.5, xs[-1] + 0.5, color="red", alpha=0.07,
                 label=f"replicas share the {cores} cores: contention")
  rate_ax.set_ylabel("examples/s (train steps, median)")
  rate_ax.set_ylim(bottom=0)
  frac_ax.set_ylabel("fraction")
  frac_ax.set_ylim(0, max([1.1, *(r["scaling_efficiency"] or 0 for r in rows)]))
  rate_ax.legend(fontsize=8, loc="upper left")
  frac_ax.legend(fontsize=8, loc="best")
  fig.suptitle(_title(report), fontsize=10)
  common.write_atomically(
      path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))


def _plot_group(rate_ax, frac_ax, rows, multi: bool) -> None:
  """One series: single-process points (circles) or multi-worker (squares)."""
  style = (dict(color="tab:red", marker="s", ls=":", ms=8) if multi
           else dict(color="tab:blue", marker="o", ls="-", ms=7))
  label = ("MultiWorkerMirrored: N processes x 1 replica" if multi
           else "1 process: OneDevice (1), Mirrored (N logical CPUs)")
  # Shifted a little right: a worker point and a Mirrored one at the same
  # replica count stay visible side by side.
  xs = [r["replicas"] + (0.04 if multi else 0) for r in rows]
  rates = [r["examples_per_sec"] for r in rows]
  errors = [[rate - r["examples_per_sec_min"] for rate, r in zip(rates, rows)],
            [r["examples_per_sec_max"] - rate for rate, r in zip(rates, rows)]]
  rate_ax.errorbar(xs, rates, yerr=errors, capsize=3, label=label, **style)
  for x, rate in zip(xs, rates):
    # Below right: clear of the ideal line, which rises to the right.
    rate_ax.annotate(f"{rate:,.0f}", (x, rate), textcoords="offset points",
                     xytext=(7, -11), fontsize=7, color=style["color"])
  tag = "workers" if multi else "1 process"
  eff = [(x, r["scaling_efficiency"]) for x, r in zip(xs, rows)
         if r["scaling_efficiency"] is not None]
  if eff:
    frac_ax.plot(*zip(*eff), label=f"scaling efficiency ({tag})", **style)
  sync = [(x, r["sync_fraction"]) for x, r in zip(xs, rows)
          if r["sync_fraction"] is not None]
  if sync:
    frac_ax.plot(*zip(*sync), label=f"sync fraction of the step ({tag})",
                 **dict(style, ls="--", mfc="none"))


def _title(report: dict) -> str:
  batch = (f"{report['per_replica_batch']} examples per replica"
           if report["mode"] == "weak"
           else f"global batch {report['global_batch_size']}")
  host, k = report["host"], report["cores_per_replica"]
  pinning = (f"{k} core(s) per replica (pinned)" if k else
             "unpinned: every run on all cores (costs, not scaling)")
  title = (f"{report['config']}: {report['mode']} scaling ({batch}), "
           f"{report['steps']} steps x {report['repeats']} run(s) per point\n"
           f"host: {host['cores']} CPU cores, {host['machine']}, "
           f"TensorFlow {host['tensorflow']}; {pinning}")
  if report["oversubscribed"]:
    title += ("\nshaded: replicas share cores, so those points measure "
              "contention, not scaling")
  return title


# ---- TensorBoard HParams -----------------------------------------------------


def _tf():
  """TensorFlow and the hparams API, imported on first use (seconds)."""
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  return tf, hp


def point_hparams(point, config: str, mode: str) -> dict:
  """The HParams-tab columns of one point (names are the config's terms)."""
  return {"config": config, "mode": mode, "strategy": point.strategy,
          "replicas": point.replicas, "workers": point.workers,
          "global_batch_size": point.global_batch,
          "per_replica_batch": point.per_replica_batch,
          "cores_per_replica": point.cores_per_replica}


def write_hparams_config(out: str, points: list, config: str,
                         mode: str) -> None:
  """Declares the experiment (its hparams, their values, the metrics) in OUT."""
  tf, hp = _tf()
  columns = {}
  for point in points:
    for name, value in point_hparams(point, config, mode).items():
      columns.setdefault(name, set()).add(value)
  hparams = [hp.HParam(name, hp.Discrete(sorted(values)))
             for name, values in columns.items()]
  metrics = [hp.Metric(tag, display_name=label) for tag, label in METRICS]
  writer = tf.summary.create_file_writer(out)
  with writer.as_default():
    hp.hparams_config(hparams=hparams, metrics=metrics)
  writer.close()


def write_run_hparams(workdir: str, point, config: str, mode: str,
                      steps: int, summary: dict, baseline) -> None:
  """One run's hparams and metrics, beside the trainer's events.

  The trial id is the point's name, so repeats of a point form one session
  group. `baseline` is the 1-replica run's examples/s (None: no efficiency).
  """
  tf, hp = _tf()
  rate = summary["examples_per_sec"]
  values = {"scaling/examples_per_sec": rate,
            "scaling/examples_per_sec_per_replica": rate / point.replicas,
            "scaling/efficiency": efficiency(rate, point.replicas,
                                             baseline)[1],
            "scaling/sync_fraction": summary.get("sync_fraction")}
  writer = tf.summary.create_file_writer(workdir)
  with writer.as_default(step=steps):
    hp.hparams(point_hparams(point, config, mode), trial_id=point.name)
    for tag, value in values.items():
      if value is not None:
        tf.summary.scalar(tag, value)
  writer.close()
