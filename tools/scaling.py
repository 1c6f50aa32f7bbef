"""Scaling sweep: one config at several replica and worker counts, measured.

Runs `python -m dist_keras.train` once per point, each in its own process
and workdir, then reads every run's summary.json and reports throughput,
per-replica throughput, speedup and scaling efficiency beside the sync
breakdown (compute, input wait, straggler wait, all-reduce).

  python tools/scaling.py --config=lstm_longmem --replicas=1,2,4 \\
      --workers=2,3 --steps=300 --out=runs/scaling [--mode=weak|strong] \\
      [-- --config.KEY=VALUE ...]

Points (each in OUT/<point>/, its workdir and TensorBoard run):
  replicas_N  one process: OneDeviceStrategy for N=1, else MirroredStrategy
              over N logical CPU devices (runtime.num_cpu_devices=N).
  workers_W   W processes on 127.0.0.1 (tools/launch_local.py: free ports,
              TF_CONFIG), MultiWorkerMirroredStrategy, one CPU replica each.
With --repeats=K every point runs K times, in K rounds of the whole sweep
(drift hits every point alike), into OUT/<point>/run<k>/; the figures are
medians and the spread is reported.

Batch: weak scaling (default) fixes the batch per replica, so the global
batch grows with the replicas: --per_replica_batch, default the config's
global batch over its default replica count (runtime.num_cpu_devices; 256/2
= 128 for lstm_longmem). Strong scaling fixes the global batch:
--global_batch, default the config's, rounded up to a multiple of every
replica count so every point divides it (256 -> 264 for 1,2,3,4).

Definitions (the same formula in both modes; what differs is the work each
replica does per step):
  speedup(N)    = examples_per_sec(N) / examples_per_sec(1 replica)
  efficiency(N) = speedup(N) / N
                = examples_per_sec(N) / (N * examples_per_sec(1 replica))
The 1-replica point is the baseline for the multi-worker points too; without
it, no speedup or efficiency is reported. Throughput is the trainer's own
(summary.json: train steps only, after the first logged interval, which
holds tracing; eval and checkpoints excluded).

Hardware: each run is pinned (Linux CPU affinity, tools/pin_cores.py) to
--cores_per_replica cores per replica (default 1): the 1-replica baseline
computes on one core, N Mirrored replicas on N cores, and worker W of a
multi-worker point on its own core. Unpinned (--cores_per_replica=0),
TensorFlow spreads even one replica over every core, so more replicas add
no hardware: the figures then show what data parallelism costs at fixed
hardware, not how it scales. Replicas beyond the host's cores share cores
either way: those points measure contention, not scaling; the tool prints
the core count and warns about them, and the plot shades them.

Writes, at the end and atomically: OUT/scaling.json (every point with each
run's throughput, the failed runs, the host) and OUT/scaling.png
(throughput against replicas with the ideal line; efficiency and sync
fraction; multi-worker points marked apart), which needs matplotlib:
pip install -e ".[tools]". TensorBoard's HParams tab
(tensorboard --logdir OUT) sets the points side by side: the experiment is
declared at OUT, and each run's hparams and metrics are written into its
workdir as soon as it finishes.

Exit status: 0 every run succeeded; 1 some run failed (its exit code and
the tail of its log were printed; the sweep went on and the rest was
written); 2 bad arguments (one line, nothing run); 130 or 143 stopped by
SIGINT (Ctrl-C) or SIGTERM: the running point is stopped (its processes
too), no scaling.json or scaling.png is written.
"""
import argparse
import dataclasses
import datetime
import functools
import importlib
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time

import common
import scaling_report
from common import REPO, BadInput

PROG = "scaling"
EXIT_OK, EXIT_RUN_FAILED = 0, 1  # 2: bad arguments (common.fail).
# The sweep sets these keys itself, per point.
SWEEP_KEYS = ("runtime.strategy", "runtime.num_cpu_devices",
              "train.global_batch_size", "train.steps")
# Defaults for every point (the user's overrides after `--` win): no
# post-training calibration and no mid-run eval, which cost wall time and
# are not what a sweep compares.
POINT_DEFAULTS = ("log.calibration_steps=0", "eval.every=0")
# What --overwrite may delete from OUT: only what this tool writes.
_OWN_ENTRY = re.compile(r"^((replicas|workers)_\d+|scaling\.(json|png)|"
                        r"events\.out\.tfevents\..*|.*\.tmp)$")
LOG_FILE = "train.log"
TAIL_LINES = 15
STOP_GRACE_SECONDS = 20  # > launch_local's 10 s grace for its workers.
say = functools.partial(common.say, PROG)


class Stopped(Exception):
  """SIGINT or SIGTERM reached the tool; `signum` says which."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def _raise_stopped(signum, _frame):
  raise Stopped(signum)


@dataclasses.dataclass(frozen=True)
class Point:
  """One configuration of the sweep."""
  name: str  # replicas_N | workers_W: its folder under OUT.
  strategy: str  # The runtime.strategy value.
  replicas: int  # Replicas in sync, over all processes.
  workers: int  # Processes.
  global_batch: int
  cores_per_replica: int = 0  # 0: unpinned, every run on every core.
  # The CPU cores each process is pinned to, one tuple per process.
  cores: tuple = ()

  @property
  def per_replica_batch(self) -> int:
    return self.global_batch // self.replicas

  @property
  def is_baseline(self) -> bool:
    """The 1-replica, 1-process point: speedup and efficiency divide by it."""
    return self.replicas == 1 and self.workers == 1

  @property
  def multi_worker(self) -> bool:
    return self.strategy == "multi_worker_mirrored"

  def describe(self) -> str:
    if self.multi_worker:
      where = (f"MultiWorkerMirroredStrategy, {self.workers} workers x 1 "
               "replica")
    elif self.replicas == 1:
      where = "OneDeviceStrategy, 1 replica"
    else:
      where = (f"MirroredStrategy, {self.replicas} replicas "
               f"({self.replicas} logical CPUs)")
    return (f"{where}, global batch {self.global_batch} "
            f"({self.per_replica_batch} per replica), {self.cores_text()}")

  @property
  def cores_spec(self) -> str:
    """The core sets as tools/pin_cores.py takes them: "0,1" or "0/1/0"."""
    return "/".join(",".join(map(str, c)) for c in self.cores)

  def cores_text(self) -> str:
    if not self.cores:
      return "unpinned"
    many = len(self.cores) > 1 or len(self.cores[0]) > 1
    return f"pinned to core{'s' if many else ''} {self.cores_spec}"

  def oversubscribed(self, host_cores: int) -> bool:
    """Whether its replicas share cores: pinned, more cores than the host
    has; unpinned, more replicas than cores (as every run takes them all)."""
    return self.replicas * max(1, self.cores_per_replica) > host_cores


# ---- arguments ---------------------------------------------------------------


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """Splits argv at the first `--` into (tool options, config overrides)."""
  if "--" not in argv:
    return argv, []
  split = argv.index("--")
  return argv[:split], argv[split + 1:]


def counts(flag: str, text: str, minimum: int) -> list[int]:
  """Parses "1,2,4" into [1, 2, 4]; "" into [] (skip that kind of point)."""
  if not text.strip():
    return []
  try:
    values = [int(v) for v in text.split(",")]
  except ValueError:
    values = None
  if values is None or min(values) < minimum:
    raise BadInput(f"--{flag}={text!r} must be comma-separated integers >= "
                   f"{minimum}, e.g. --{flag}={minimum},{minimum + 1}.")
  if len(set(values)) != len(values):
    raise BadInput(f"--{flag}={text!r} names a count twice; give each once.")
  return sorted(values)


def config_overrides(args: list[str]) -> list[str]:
  """`--config.S.K=V` arguments -> ["S.K=V", ...], refusing the sweep's own.

  Only the prefix is checked here; load_config parses the rest.
  """
  overrides = []
  for arg in args:
    if not arg.startswith("--config."):
      raise BadInput(f"{arg!r} after -- must be --config.SECTION.KEY=VALUE.")
    key = arg[len("--config."):].split("=", 1)[0]
    if key in SWEEP_KEYS:
      instead = {"train.steps": "--steps",
                 "train.global_batch_size": "--per_replica_batch (weak) or "
                 "--global_batch (strong)"}.get(key, "--replicas/--workers")
      raise BadInput(f"--config.{key} is set by the sweep for each point; "
                     f"use {instead} instead.")
    overrides.append(arg[len("--config."):])
  return overrides


def load_config(spec: str, overrides: list[str]):
  """The config with the tool's defaults and the user's overrides applied.

  Checked here, before any run: a typo must not fail every point in turn.
  """
  return common.load_config(spec, [*POINT_DEFAULTS, *overrides], "--config.")


def parse_args(argv=None) -> argparse.Namespace:
  """Parses and checks the arguments; adds .argv, .overrides and .points.

  Raises:
    BadInput: a value is missing, malformed or inconsistent.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  options, extra = _split_overrides(argv)
  p = common.Parser(prog="scaling.py", allow_abbrev=False,
                    usage="%(prog)s --out=DIR [options] [-- "
                    "--config.KEY=VALUE ...]",
                    description=__doc__.splitlines()[0])
  common.add_config_args(p, overrides=False)
  p.add_argument("--replicas", default="1,2,4",
                 help="Replica counts in ONE process (default %(default)s; "
                 "'' for none).")
  p.add_argument("--workers", default="2,3",
                 help="MultiWorkerMirrored worker counts on 127.0.0.1, one "
                 "replica each (default %(default)s; '' for none).")
  p.add_argument("--steps", type=int, default=300,
                 help="Train steps per run (default %(default)s).")
  p.add_argument("--mode", choices=("weak", "strong"), default="weak",
                 help="weak: fixed batch per replica; strong: fixed global "
                 "batch (default %(default)s).")
  p.add_argument("--per_replica_batch", type=int,
                 help="Weak scaling: examples per replica per step (default: "
                 "the config's global batch / its runtime.num_cpu_devices).")
  p.add_argument("--global_batch", type=int,
                 help="Strong scaling: the global batch of every point "
                 "(default: the config's, rounded up to a multiple of every "
                 "replica count).")
  p.add_argument("--cores_per_replica", type=int, default=1,
                 help="Pin each run to this many CPU cores per replica "
                 "(Linux affinity; default %(default)s), so N replicas "
                 "compute on N times the cores of one. 0: unpinned, every "
                 "run on every core (fixed hardware: what data parallelism "
                 "costs, not how it scales).")
  p.add_argument("--repeats", type=int, default=1,
                 help="Runs per point, in rounds (default %(default)s).")
  p.add_argument("--out", required=True,
                 help="Folder for the runs, scaling.json and scaling.png; "
                 "must be new or empty (see --overwrite).")
  p.add_argument("--overwrite", action="store_true",
                 help="Delete a previous sweep's points and results in --out "
                 "first (only what this tool writes).")
  p.add_argument("--timeout", type=float, default=900.0,
                 help="Seconds before a run counts as hung and is stopped "
                 "(default %(default)s).")
  p.add_argument("--no_plot", action="store_true",
                 help="Skip scaling.png (no matplotlib needed).")
  args = p.parse_args(options)
  args.argv = argv
  args.overrides = config_overrides(extra)
  config = load_config(args.config, args.overrides)
  _check(args, config)
  args.points = plan(args, config, available_cores())
  args.out = os.path.abspath(args.out)
  check_out(args.out, args.overwrite)
  if not args.no_plot:
    require_matplotlib()
  return args


def _check(args: argparse.Namespace, config) -> None:
  """Refuses values and combinations argparse cannot express."""
  args.replica_counts = counts("replicas", args.replicas, 1)
  args.worker_counts = counts("workers", args.workers, 2)
  if not args.replica_counts and not args.worker_counts:
    raise BadInput("--replicas and --workers are both empty; give at least "
                   "one count, e.g. --replicas=1,2.")
  if args.cores_per_replica < 0:
    raise BadInput(f"--cores_per_replica={args.cores_per_replica} must be "
                   ">= 0 (0: unpinned).")
  if args.cores_per_replica and not hasattr(os, "sched_setaffinity"):
    raise BadInput("--cores_per_replica needs Linux CPU affinity, which "
                   "this OS lacks; pass --cores_per_replica=0 (unpinned).")
  if args.repeats < 1:
    raise BadInput(f"--repeats={args.repeats} must be >= 1.")
  if not args.timeout > 0:
    raise BadInput(f"--timeout={args.timeout} must be > 0 seconds.")
  log_every = config.train.log_every
  # The trainer's first logged interval holds tracing and is not timed.
  if args.steps < 2 * log_every:
    raise BadInput(f"--steps={args.steps} would time only "
                   f"{max(0, args.steps - log_every)} step(s): the first "
                   f"train.log_every={log_every} are warm-up; use --steps >= "
                   f"{2 * log_every} or a smaller --config.train.log_every.")
  if args.mode == "weak" and args.global_batch is not None:
    raise BadInput("--global_batch is for --mode=strong; weak scaling fixes "
                   "--per_replica_batch.")
  if args.mode == "strong" and args.per_replica_batch is not None:
    raise BadInput("--per_replica_batch is for --mode=weak; strong scaling "
                   "fixes --global_batch.")
  for flag in ("per_replica_batch", "global_batch"):
    value = getattr(args, flag)
    if value is not None and value < 1:
      raise BadInput(f"--{flag}={value} must be >= 1.")


def plan(args: argparse.Namespace, config, cores: list[int]) -> list[Point]:
  """The sweep's points, single-process ones first (the baseline leads).

  `cores`: the core numbers this process may use, to pin runs to.
  """
  replica_counts = args.replica_counts + args.worker_counts
  if args.mode == "weak":
    per_replica = args.per_replica_batch or default_per_replica_batch(config)
    batch = {n: per_replica * n for n in replica_counts}
  else:
    batch = dict.fromkeys(replica_counts, strong_global_batch(
        args.global_batch, config.train.global_batch_size, replica_counts))
  k = args.cores_per_replica
  points = [Point(f"replicas_{n}", "one_device" if n == 1 else "mirrored", n,
                  1, batch[n], k, process_cores(cores, 0, n * k))
            for n in args.replica_counts]
  points += [Point(f"workers_{w}", "multi_worker_mirrored", w, w, batch[w], k,
                   sum((process_cores(cores, i * k, k) for i in range(w)),
                       ()))
             for w in args.worker_counts]
  return points


def process_cores(cores: list[int], first: int, count: int) -> tuple:
  """((core, ...),): `count` of `cores` from index `first`, wrapping around
  when there are fewer (those replicas then share cores); () if count is 0."""
  if not count:
    return ()
  return (tuple(sorted({cores[(first + i) % len(cores)]
                        for i in range(count)})),)


def default_per_replica_batch(config) -> int:
  """The config's global batch over its default replica count."""
  batch, replicas = (config.train.global_batch_size,
                     config.runtime.num_cpu_devices)
  if batch % replicas:
    raise BadInput(f"the config's global batch {batch} does not split over "
                   f"its {replicas} replicas; pass --per_replica_batch.")
  return batch // replicas


def strong_global_batch(given, config_batch: int, replica_counts) -> int:
  """--global_batch checked, or the config's rounded up to fit every count."""
  multiple = math.lcm(*replica_counts)
  if given is None:
    return -(-config_batch // multiple) * multiple
  bad = [n for n in replica_counts if given % n]
  if bad:
    raise BadInput(f"--global_batch={given} does not split over {bad[0]} "
                   f"replicas; use a multiple of {multiple}, e.g. "
                   f"{-(-given // multiple) * multiple}.")
  return given


def check_out(out: str, overwrite: bool) -> None:
  """Refuses an OUT holding anything, unless --overwrite may clear it.

  A stale point folder would make its trainer RESUME from the old
  checkpoint and train no steps at all: a sweep must start from nothing.
  """
  if os.path.exists(out) and not os.path.isdir(out):
    raise BadInput(f"--out={out} is a file; pass a folder.")
  entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
  if not entries:
    return
  foreign = [e for e in entries if not _OWN_ENTRY.match(e)]
  if not overwrite:
    raise BadInput(f"--out={out} is not empty (holds {entries[0]}); pass a "
                   "new folder, or --overwrite to replace a previous sweep.")
  if foreign:
    raise BadInput(f"--out={out} holds {foreign[0]}, which this tool did "
                   "not write; --overwrite only replaces a sweep, pass a new "
                   "folder.")


def clear_out(out: str) -> None:
  """Deletes a previous sweep's entries (check_out has vetted them)."""
  for entry in os.listdir(out) if os.path.isdir(out) else []:
    path = os.path.join(out, entry)
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


def require_matplotlib() -> None:
  try:
    importlib.import_module("matplotlib")
  except ImportError:
    raise BadInput('matplotlib is needed for scaling.png: pip install -e '
                   '".[tools]" (or pass --no_plot).') from None


def available_cores() -> list[int]:
  """The CPU cores this process may run on (its affinity, else all)."""
  try:
    return sorted(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return list(range(os.cpu_count() or 1))


def host_cores() -> int:
  return len(available_cores())


# ---- running -----------------------------------------------------------------


def run_dir(out: str, point: Point, repeat: int, repeats: int) -> str:
  """A run's workdir: OUT/<point>, or OUT/<point>/run<k> with repeats."""
  base = os.path.join(out, point.name)
  return base if repeats == 1 else os.path.join(base, f"run{repeat + 1}")


def train_command(point: Point, args, workdir: str) -> list[str]:
  """The command line of one run (the launcher's for multi-worker points)."""
  train = [sys.executable, "-m", "dist_keras.train",
           f"--config={common.child_spec(args.config)}",
           f"--workdir={workdir}",
           f"--config.runtime.strategy={point.strategy}",
           # One logical CPU per process unless Mirrored splits it.
           f"--config.runtime.num_cpu_devices="
           f"{1 if point.multi_worker else point.replicas}",
           f"--config.train.global_batch_size={point.global_batch}",
           f"--config.train.steps={args.steps}",
           *(f"--config.{o}" for o in (*POINT_DEFAULTS, *args.overrides))]
  if point.cores:  # Each process pins itself, then execs the trainer.
    train = [sys.executable, os.path.join(REPO, "tools", "pin_cores.py"),
             f"--cores={point.cores_spec}", "--", *train]
  if not point.multi_worker:
    return train
  return [sys.executable, os.path.join(REPO, "tools", "launch_local.py"),
          f"--num_workers={point.workers}", "--", *train]


def child_env() -> dict:
  """The runs' environment: this checkout first, no inherited TF_CONFIG."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  path = env.get("PYTHONPATH")
  env["PYTHONPATH"] = REPO + (os.pathsep + path if path else "")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env["PYTHONUNBUFFERED"] = "1"
  return env


def run_command(command: list[str], log_path: str,
                timeout: float) -> tuple[int | None, float]:
  """Runs `command` with stdout and stderr into `log_path`.

  Returns:
    (exit status, or None if it timed out and was stopped; wall seconds).
  Raises:
    Stopped: the tool got SIGINT or SIGTERM; the command was stopped first.
  """
  start = time.monotonic()
  with open(log_path, "wb") as log:
    # Its own session: stopping it reaches its whole process group, and a
    # Ctrl-C at the terminal reaches only this tool, which then stops it.
    proc = subprocess.Popen(command, cwd=REPO, env=child_env(),
                            stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
      code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
      stop(proc)
      return None, time.monotonic() - start
    except Stopped:
      stop(proc)
      raise
  code = 128 - code if code < 0 else code  # Killed by signal S: 128+S.
  return code, time.monotonic() - start


def stop(proc: subprocess.Popen) -> None:
  """SIGTERM to the run's process group (the launcher then stops its
  workers), SIGKILL after a grace period."""
  for signum, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS),
                       (signal.SIGKILL, None)):
    try:
      os.killpg(proc.pid, signum)
    except ProcessLookupError:
      pass
    try:
      proc.wait(wait)
      return
    except subprocess.TimeoutExpired:
      continue


def tail(path: str, lines: int = TAIL_LINES) -> list[str]:
  try:
    with open(path, errors="replace") as f:
      return f.read().splitlines()[-lines:]
  except OSError:
    return []


def check_summary(point: Point, summary: dict, steps: int) -> None:
  """Refuses a summary that does not describe the run the sweep asked for.

  Raises:
    ValueError: naming the mismatch (e.g. a GPU host where Mirrored took
      every GPU instead of N logical CPUs, or a run that resumed).
  """
  expected = {"replicas": point.replicas, "steps": steps,
              "global_batch_size": point.global_batch}
  for key, want in expected.items():
    if summary.get(key) != want:
      raise ValueError(f"summary.json says {key}={summary.get(key)!r}, the "
                       f"sweep asked for {want}")
  if not summary.get("examples_per_sec"):
    raise ValueError("summary.json has no examples_per_sec (no timed steps)")


# ---- the sweep ---------------------------------------------------------------


def host_info() -> dict:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  version = None
  for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu"):
    try:
      version = metadata.version(dist)
      break
    except metadata.PackageNotFoundError:
      continue
  return {"cores": host_cores(), "cpu_count": os.cpu_count(),
          "machine": platform.machine(), "platform": platform.platform(),
          "python": platform.python_version(), "tensorflow": version}


def announce(args, cores: int) -> list[str]:
  """Prints the sweep's header; returns the points whose replicas share
  cores."""
  batch = (f"{args.points[0].per_replica_batch} examples per replica"
           if args.mode == "weak"
           else f"global batch {args.points[0].global_batch}")
  runs = len(args.points) * args.repeats
  print(f"{PROG}: {args.config}, {args.mode} scaling ({batch}), {args.steps} "
        f"steps, {runs} run(s) into {args.out}", flush=True)
  k = args.cores_per_replica
  print(f"{PROG}: host has {cores} CPU core(s); " + (
      f"each replica pinned to {k} core(s)" if k else
      "runs unpinned: every run computes on all of them"), flush=True)
  if not k:
    say(f"warning: unpinned, 1 replica already uses all {cores} cores, so "
        "more replicas add no hardware: the figures show what data "
        "parallelism costs, not how it scales.")
  over = [p.name for p in args.points if p.oversubscribed(cores)]
  if over:
    say(f"warning: {', '.join(over)} need more than the {cores} core(s): "
        "their replicas share cores, so they measure contention, not "
        "scaling.")
  return over


def run_once(args, point: Point, repeat: int, label: str, baseline):
  """Runs one point once; returns its checked summary, or None if it failed."""
  workdir = run_dir(args.out, point, repeat, args.repeats)
  os.makedirs(workdir)
  log_path = os.path.join(workdir, LOG_FILE)
  print(f"{label} {point.name}: {point.describe()} ...", flush=True)
  code, seconds = run_command(train_command(point, args, workdir), log_path,
                              args.timeout)
  try:
    if code is None:
      raise ValueError(f"timed out after {args.timeout:g} s and was stopped")
    if code:
      raise ValueError(f"exit code {code}")
    summary = common.read_summary(workdir)
    check_summary(point, summary, args.steps)
  except ValueError as e:
    say(f"{label} {point.name}: FAILED after {seconds:.0f} s: {e}; last "
        f"lines of {log_path}:")
    for line in tail(log_path):
      print(f"    | {line}", file=sys.stderr, flush=True)
    return None
  rate = summary["examples_per_sec"]
  if point.is_baseline:
    baseline = rate
  eff = scaling_report.efficiency(rate, point.replicas, baseline)[1]
  print(f"{label} {point.name}: {rate:,.0f} ex/s ({rate / point.replicas:,.0f}"
        " per replica" + (f", efficiency {eff:.0%}" if eff is not None else "")
        + f") in {seconds:.0f} s", flush=True)
  scaling_report.write_run_hparams(workdir, point, args.config, args.mode,
                                   args.steps, summary, baseline)
  return summary


def sweep(args) -> tuple[dict, list[str]]:
  """Runs every point args.repeats times, in rounds.

  Returns:
    ({point name: [successful summaries]}, [failed runs' workdirs]).
  """
  summaries = {p.name: [] for p in args.points}
  failed = []
  total, done = len(args.points) * args.repeats, 0
  for repeat in range(args.repeats):
    baseline = None  # This round's 1-replica run: its runs' efficiency.
    for point in args.points:
      done += 1
      summary = run_once(args, point, repeat, f"[{done}/{total}]", baseline)
      if summary is None:
        failed.append(run_dir(args.out, point, repeat, args.repeats))
        continue
      summaries[point.name].append(summary)
      if point.is_baseline:
        baseline = summary["examples_per_sec"]
  return summaries, failed


def report(args, rows, failed, host, over, seconds) -> dict:
  """scaling.json's content."""
  return {
      "config": args.config, "mode": args.mode, "steps": args.steps,
      "repeats": args.repeats, "cores_per_replica": args.cores_per_replica,
      "per_replica_batch": (args.points[0].per_replica_batch
                            if args.mode == "weak" else None),
      "global_batch_size": (args.points[0].global_batch
                            if args.mode == "strong" else None),
      "overrides": args.overrides, "host": host, "oversubscribed": over,
      "baseline_examples_per_sec": scaling_report.baseline_rate(rows),
      "points": rows, "failed_runs": failed,
      "seconds": round(seconds, 1),
      "finished": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": [os.path.relpath(__file__, REPO), *args.argv],
  }


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except BadInput as e:
    return common.fail(PROG, e)
  start = time.monotonic()
  host = host_info()
  over = announce(args, host["cores"])
  if args.overwrite:
    clear_out(args.out)
  os.makedirs(args.out, exist_ok=True)
  scaling_report.write_hparams_config(args.out, args.points, args.config,
                                      args.mode)
  # A run has its own session, so a Ctrl-C reaches only this tool: the
  # handler stops the run (and the launcher its workers) before exiting.
  previous = {s: signal.signal(s, _raise_stopped)
              for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    summaries, failed = sweep(args)
  except Stopped as e:
    say(f"got {e}: the running point was stopped; no scaling.json written")
    return 128 + e.signum
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  rows = scaling_report.results(args.points, summaries)
  print(scaling_report.format_table(rows), flush=True)
  data = report(args, rows, failed, host, over, time.monotonic() - start)
  plotted = not args.no_plot and any(
      r["examples_per_sec"] is not None for r in rows)
  if plotted:
    scaling_report.plot(data, os.path.join(args.out, "scaling.png"))
  common.write_json(os.path.join(args.out, "scaling.json"), data)
  print(f"{PROG}: wrote {os.path.join(args.out, 'scaling.json')}"
        + (" and scaling.png" if plotted else "")
        + f" in {data['seconds']:.0f} s; tensorboard --logdir {args.out} "
        "(HParams tab)", flush=True)
  if failed:
    say(f"{len(failed)} run(s) failed: {', '.join(failed)}")
    return EXIT_RUN_FAILED
  return EXIT_OK


if __name__ == "__main__":
  sys.exit(main())
