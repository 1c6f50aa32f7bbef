"""dist_keras's loop against Keras' own fit, each timed the way its users run it.

Same model, data, global batch and strategy. Each side runs as its users
run it: Keras `model.fit` in ONE call of 1 + --epochs epochs of --steps
steps, timed per epoch by a callback (the first epoch, with tracing and the
iterator's start, dropped); dist_keras in ONE run of 1 + --epochs log
windows of --steps steps, timed per window by its own loop (the first
window dropped; one instrumented step per window, as a real run has). A
round runs every variant once; rounds alternate, so drift hits all alike.
Printed: per variant the median ms/step over its rounds, examples/s and the
range of the rounds; the ratios dist_keras/fit (speed: >1 means faster);
and fit's per-call overhead (wall time of the call outside
on_train_begin..on_train_end: real for users who call fit in a loop, but not
step speed). A benchmark, not a test. Each run has its own Python process,
as users start each tool (TensorFlow's start not timed); --no-fresh runs
them all in this process (quicker, but a run can slow the runs after it:
docs/performance.md).

  python tools/bench.py --config=lstm_longmem --rounds=3 --epochs=4 \\
      --steps=50 --out=bench.json

Your own model and data: --override=model.name=PKG.MODULE:FN (and
data.name, train.global_batch_size) bench the model_fn / dataset_fn that
`python -m dist_keras.train` would train; fit trains that model as its
model_fn compiled it, on that pipeline.

Variants, each on one device (fit with no strategy; dist_keras on
OneDeviceStrategy) and under MirroredStrategy over runtime.num_cpu_devices
devices: "defaults" (each side's own: fit one step per call; dist_keras the
config's train.steps_per_loop, 0 = automatic); "xla" and "bfloat16"
(each side's default steps per call with fit's jit_compile=True /
train.jit_compile=True, or under Keras' mixed_bfloat16 policy /
train.precision=bfloat16: fit's per-call steps fail under MirroredStrategy,
and its jit_compile=True fails there too, so bfloat16 is what a fit user
there can run); "per_call" (fit:
steps_per_execution=K; dist_keras: train.steps_per_loop=K; K=--per_call);
"per_call+xla" (the same with fit's jit_compile=True and dist_keras's
train.jit_compile=True);
"per_call+bfloat16" (per-call steps under Keras' mixed_bfloat16 policy:
train.precision=bfloat16 for dist_keras, the policy set while the model is
built for fit). --settings picks variants (best: all but defaults). Ratios:
per variant where both sides ran it, and "best", each side's fastest
variant that ran, defaults included: an option that does not pay on this
hardware (XLA for the LSTM on one CPU device, measured 2026-12-01; under
Mirrored it paid) is forced on neither side. A variant that fails is
reported as such (Keras 3.15's fit with steps_per_execution > 1 fails
under MirroredStrategy here).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PROG = "bench"
WHERE = ("one", "mirrored")  # One device, MirroredStrategy.
# A --only run's result line: [ms, overhead, replicas under Mirrored]; or,
# if the run failed, its error line.
_RESULT = "bench-run: "
_ERROR = "bench-error: "
# Each variant: (per call, XLA, precision), in the order a round runs them.
VARIANTS = {"defaults": (False, False, "float32"),
            "xla": (False, True, "float32"),
            "bfloat16": (False, False, "bfloat16"),
            "per_call": (True, False, "float32"),
            "per_call+xla": (True, True, "float32"),
            "per_call+bfloat16": (True, False, "bfloat16")}
# --settings names a variant or one of these groups of them: best is every
# variant with a speed option.
GROUPS = {"best": [v for v in VARIANTS if v != "defaults"]}


def fit_runner(c, strategy, args, per_call: bool, xla: bool,
               precision: str):
  """A `() -> (ms per step, per-call overhead s)` of one fit call."""
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf

  from dist_keras import registry
  from dist_keras.contract import checks
  # The model_fn and dataset_fn dist_keras trains: a built-in's or, with
  # model.name / data.name = PKG.MODULE:FN, the user's own.
  model_fn, dataset_fn = registry.resolve(c)
  keras.utils.set_random_seed(c.runtime.seed)
  # Built and compiled as dist_keras builds it (in the scope, same policy).
  model = checks.call_model_fn(model_fn, strategy, precision)
  if per_call or xla:
    # Read by fit's first call. Set on the compiled model, not by compiling
    # again: the model keeps its own loss, metrics and optimizer.
    model.steps_per_execution = args.per_call if per_call else 1
    model.jit_compile = xla
  # One input pipeline for the whole batch (InputContext(): one replica),
  # so its batches are global ones, as fit expects; the pipeline as the
  # dataset_fn returns it (dist_keras adds no stage to it either).
  ds = dataset_fn("train", tf.distribute.InputContext())
  _check_global_batches(ds, c.train.global_batch_size)

  class Timer(keras.callbacks.Callback):
    def __init__(self):
      super().__init__()
      self.epochs, self.train = [], [0.0, 0.0]

    def on_train_begin(self, logs=None):
      self.train[0] = time.perf_counter()

    def on_train_end(self, logs=None):
      self.train[1] = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
      self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
      self.epochs.append(time.perf_counter() - self.start)

  def run():
    timer = Timer()
    start = time.perf_counter()
    model.fit(ds, steps_per_epoch=args.steps, epochs=1 + args.epochs,
              verbose=0, callbacks=[timer])
    call = time.perf_counter() - start
    ms = 1e3 * statistics.median(timer.epochs[1:]) / args.steps
    return ms, call - (timer.train[1] - timer.train[0])

  return run


def _check_global_batches(ds, global_batch: int) -> None:
  """Examples/s count train.global_batch_size a step: fit's batches (one
  input pipeline) must hold as many, or its figure is off by their ratio
  (a user's dataset_fn batching a fixed size, the override forgotten)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf

  from dist_keras.errors import UserError
  x = ds.element_spec[0] if isinstance(ds.element_spec, tuple) else (
      ds.element_spec)
  sizes = {spec.shape[0] for spec in tf.nest.flatten(x)}
  if sizes != {global_batch}:
    raise UserError(
        f"dataset_fn('train', ...) of one input pipeline yields batches of "
        f"{', '.join(map(str, sorted(sizes, key=str)))} examples, not "
        f"train.global_batch_size={global_batch}; batch with "
        "input_context.get_per_replica_batch_size(global_batch_size), or "
        "pass --override=train.global_batch_size=N for its batches of N.")


def dist_keras_runner(c, strategy, args, per_call: bool, xla: bool,
                      precision: str):
  """A `() -> (ms per step, None)` of one dist_keras run."""
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  c.train.steps = (1 + args.epochs) * args.steps
  c.train.log_every = args.steps
  c.train.checkpoint_every = c.train.steps  # Only the final one.
  c.eval.every = 0  # Only the final eval (after the timed windows).
  c.log.progress = c.log.tensorboard = False
  c.log.calibration_steps = 0
  c.log.peak_tflops = c.log.peak_tflops or 1.0  # No timed matmul.
  if per_call:  # Else the config's own (0: automatic, dist_keras' default).
    c.train.steps_per_loop = args.per_call
  c.train.jit_compile, c.train.precision = xla, precision

  def run():
    with (tempfile.TemporaryDirectory() as workdir,
          api.build(api.Job(c, workdir, strategy)) as trainer):
      summary = trainer.run()
    return summary["step_ms_median"], None  # Window 1 left out.

  return run


def parse_args(argv=None):
  p = common.Parser(prog="bench.py", description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--rounds", type=int, default=3, help="(default %(default)s)")
  p.add_argument("--epochs", type=int, default=4,
                 help="timed epochs / log windows per call or run, after "
                 "the first (default %(default)s)")
  p.add_argument("--steps", type=int, default=50,
                 help="steps per epoch / log window (default %(default)s)")
  p.add_argument("--per_call", type=int, default=25,
                 help="steps per call in the per_call variants: fit's "
                 "steps_per_execution, train.steps_per_loop (default "
                 "%(default)s)")
  p.add_argument("--settings", default="defaults,best",
                 help="the variants to run, comma-separated: "
                 f"{', '.join(VARIANTS)}, or best (all but defaults; e.g. "
                 "defaults,per_call,per_call+xla leaves out bfloat16 on "
                 "hardware without it) (default %(default)s)")
  p.add_argument("--fresh", action=argparse.BooleanOptionalAction,
                 default=True,
                 help="each run in a new Python process, as users start "
                 "fit's scripts and dist_keras (TensorFlow's start-up not "
                 "timed); --no-fresh: every run in this process, where a "
                 "run can slow the later ones (default %(default)s)")
  p.add_argument("--only", default="", help=argparse.SUPPRESS)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  names = args.settings.split(",")
  unknown = [n for n in names if n not in VARIANTS and n not in GROUPS]
  if unknown:
    raise common.BadInput(
        f"--settings={args.settings}: {unknown[0]!r} is not a variant; use "
        f"{', '.join([*VARIANTS, *GROUPS])}, comma-separated.")
  chosen = {v for n in names for v in GROUPS.get(n, [n])}
  args.variants = [v for v in VARIANTS if v in chosen]
  for name in ("rounds", "epochs", "steps", "per_call"):
    if getattr(args, name) < 1:
      raise common.BadInput(f"--{name}={getattr(args, name)} must be >= 1.")
  c = common.load_config(args.config, args.override)  # Fails before a run.
  # What is benched: the config, or the user's model and data in it.
  args.model = args.config if ":" not in c.model.name else (
      f"{c.model.name} on {c.data.name}")
  if args.only and args.only not in _names(args):
    raise common.BadInput(f"--only={args.only}: not one of the runs of "
                          f"--settings={args.settings}.")
  return args


def _names(args) -> list[str]:
  """"SIDE, VARIANT, WHERE" of every run, in the order a round runs them."""
  return [f"{side}, {label}, {where}" for where in WHERE
          for label in args.variants for side in ("fit", "dist_keras")]


def _runner(name: str, args, places):
  """The in-process runner of run `name` (see _names)."""
  side, label, where = name.split(", ")
  make = fit_runner if side == "fit" else dist_keras_runner
  c = common.load_config(args.config, args.override)
  return make(c, places[f"{side}/{where}"], args, *VARIANTS[label])


def fresh_runner(args, name: str, seen: dict):
  """A `() -> (ms per step, overhead)` that runs `name` once in a new
  Python process (this script with --only=NAME), as each tool's users start
  it: no run inherits another's memory, threads or traced functions. The
  process's replica count under Mirrored goes into seen["replicas"]."""
  command = [sys.executable, os.path.abspath(__file__),
             f"--config={args.config}",
             *[f"--override={o}" for o in args.override],
             f"--epochs={args.epochs}", f"--steps={args.steps}",
             f"--per_call={args.per_call}", f"--only={name}"]

  def run():
    ms, overhead, seen["replicas"] = common.child_result(command, _RESULT,
                                                         _ERROR)
    return ms, overhead

  return run


def _measure(runners, rounds):
  """{name: [(ms, overhead) per round]} or {name: error text}."""
  results = {name: [] for name in runners}
  for r in range(rounds):
    for name, run in runners.items():
      if isinstance(results[name], str):
        continue
      try:
        results[name].append(run())
      except Exception as e:  # pylint: disable=broad-except
        results[name] = common.one_line(e)
      # Each figure as it comes: a long bench stopped early (a timeout, a
      # Ctrl-C) still leaves its finished rounds on the terminal.
      got = results[name]
      common.say(PROG, f"round {r + 1}/{rounds}: {name}: " + (
          got if isinstance(got, str) else f"{got[-1][0]:.2f} ms/step"))
  return results


def report(results, args, replicas: int, global_batch: int) -> dict:
  out = {"config": args.config, "model": args.model, "replicas": replicas,
         "global_batch_size": global_batch, "rounds": args.rounds,
         "epochs": args.epochs, "steps": args.steps,
         "per_call": args.per_call, "variants": {}, "ratios": {}}
  print(f"{args.model}: {replicas} replicas under Mirrored, global batch "
        f"{global_batch}; {args.rounds} round{'s' * (args.rounds != 1)} of "
        f"1 + {args.epochs} x "
        f"{args.steps} steps per variant (medians over rounds)")
  for name, rows in results.items():
    if isinstance(rows, str):
      out["variants"][name] = {"error": rows}
      print(f"  {name:34} failed: {rows}")
      continue
    ms = [m for m, _ in rows]
    median = statistics.median(ms)
    entry = {"ms_per_step": median, "rounds_ms": ms,
             "examples_per_sec": 1e3 * global_batch / median}
    overhead = [o for _, o in rows if o is not None]
    if overhead:
      entry["per_call_overhead_s"] = statistics.median(overhead)
    out["variants"][name] = entry
    print(f"  {name:34} {entry['ms_per_step']:8.2f} ms/step "
          f"{entry['examples_per_sec']:9,.0f} ex/s  (rounds "
          f"{min(ms):.2f}-{max(ms):.2f})"
          + (f"  fit per-call overhead {entry['per_call_overhead_s']:.2f} s"
             if overhead else ""))
  # Each variant's ratio where both sides ran it, then best against best:
  # each side's fastest variant that ran.
  best = ["best"] if len(args.variants) > 1 else []
  for where in WHERE:
    for label in args.variants + best:
      if label == "best":
        fit, ours = (_fastest(out["variants"], side, where)
                     for side in ("fit", "dist_keras"))
      else:
        fit, ours = (out["variants"].get(f"{side}, {label}, {where}", {}).get(
            "ms_per_step") for side in ("fit", "dist_keras"))
      if fit and ours:
        out["ratios"][f"{label}, {where}"] = fit / ours
        print(f"  dist_keras / fit, {label}, {where}: {fit / ours:.2f}x")
  return out


def _fastest(variants, side: str, where: str):
  """The lowest ms/step of `side`'s variants at `where` that ran."""
  ms = [v["ms_per_step"] for name, v in variants.items()
        if name.startswith(f"{side},") and name.endswith(f", {where}")
        and "ms_per_step" in v]
  return min(ms) if ms else None


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except common.BadInput as e:
    return common.fail(PROG, e)
  c = common.load_config(args.config, args.override)
  if args.fresh and not args.only:  # --only: the one run of this process.
    # TensorFlow starts in each run's own process only.
    seen = {}
    results = _measure({name: fresh_runner(args, name, seen)
                        for name in _names(args)}, args.rounds)
    return _report(results, args, seen.get("replicas", 0),
                   c.train.global_batch_size)
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top
  # Split into runtime.num_cpu_devices logical devices in every process, as
  # a dist_keras run splits them whatever its strategy.
  mirrored = strategies.get_strategy(c.runtime)
  places = {"fit/one": tf.distribute.get_strategy(),  # No strategy.
                "fit/mirrored": mirrored,
                "dist_keras/one": tf.distribute.OneDeviceStrategy("/cpu:0"),
                "dist_keras/mirrored": mirrored}
  if args.only:  # One run, for a --fresh parent.
    try:
      ms, overhead = _runner(args.only, args, places)()
    except Exception as e:  # pylint: disable=broad-except
      print(_ERROR + common.one_line(e), flush=True)
      return 1
    print(_RESULT + json.dumps([ms, overhead, mirrored.num_replicas_in_sync]))
    return 0
  results = _measure({name: _runner(name, args, places)
                      for name in _names(args)}, args.rounds)
  return _report(results, args, mirrored.num_replicas_in_sync,
                 c.train.global_batch_size)


def _report(results, args, replicas: int, global_batch: int) -> int:
  out = report(results, args, replicas, global_batch)
  if args.out:
    common.write_json(args.out, out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
