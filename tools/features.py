"""Speed features on and off: the real loop's throughput per variant.

Each variant is a set of config overrides (train.steps_per_loop=10,
train.jit_compile=True, train.precision=bfloat16, runtime.allreduce_dtype=
bfloat16, data.prefetch=False, ...). In ONE process and under ONE strategy,
every repeat trains each variant in turn for --steps steps with
`dist_keras.fit`, exactly what a user runs (eval, checkpoints and calibration
off), and reads its examples/s, which leaves out the first log window
(tracing, XLA compilation): alternating, so drift hits all variants alike.
Prints medians, speed relative to the first variant, and the eval accuracy
each reached; writes JSON. Under tools/launch_local.py every worker runs the
same sequence, so it measures MultiWorkerMirroredStrategy too (e.g.
runtime.bytes_per_pack). A benchmark, not a test.

  python tools/features.py --config=lstm_longmem --steps=200 --repeats=3 \\
      --variant= --variant=train.steps_per_loop=10 \\
      --variant=train.precision=bfloat16,train.steps_per_loop=10
  python tools/features.py --variant_set=speed   # docs/performance.md's table.
  python tools/features.py --variant_set=sync_timing   # What timing costs.
"""
import json
import os
import statistics
import sys
import tempfile

import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PROG = "features"
# Named lists of variants (--variant_set), each led by the baseline: the
# speed options, the sync breakdown's timing on and off (whole runs in one
# process), and the options that matter between workers (run the tool
# under tools/launch_local.py for those).
VARIANT_SETS = {
    "speed": ["", "train.steps_per_loop=1", "train.jit_compile=True",
              "train.precision=bfloat16", "train.precision=float16",
              "runtime.allreduce_dtype=bfloat16", "data.prefetch=False",
              "data.threads=2", "log.sync_timing=False"],
    "sync_timing": ["", "log.sync_timing=False"],
    "multi_worker": ["", "runtime.bytes_per_pack=32768",
                     "runtime.allreduce_dtype=bfloat16"],
}


def parse_variant(text: str) -> list[str]:
  """'a.b=1,c.d=x' -> ['a.b=1', 'c.d=x']; '' (the baseline) -> []."""
  return [part.strip() for part in text.split(",") if part.strip()]


def variant_config(spec: str, overrides, variant, steps: int):
  """The config of one block: `spec` + overrides + variant, timed like a
  real run, with nothing but training in the block.

  Raises:
    common.BadInput: naming the bad override or variant.
  """
  common.load_config(spec, overrides)  # A bad override is named as one.
  c = common.load_config(spec, [*overrides, *variant], "--variant ")
  c.train.steps = steps
  c.train.checkpoint_every = steps
  c.eval.every, c.eval.steps = 0, 2
  c.log.calibration_steps, c.log.progress = 0, False
  c.log.tensorboard = False
  return c


def run_block(c, strategy) -> dict:
  """One block: `dist_keras.fit` as a user calls it; its figures."""
  import dist_keras  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as workdir:
    summary = dist_keras.fit(c.model.name, c.data.name, workdir=workdir,
                             config=c, strategy=strategy).summary
  # A user's model may have no accuracy metric: its eval loss is read then.
  return {k: summary.get(k) for k in ("examples_per_sec", "eval_accuracy",
                                      "eval_loss", "train_loss",
                                      "sync_fraction")}


def parse_args(argv=None):
  """The arguments, every variant's config loaded and checked (.configs).

  Raises:
    common.BadInput: a bad argument, override or variant; nothing has run.
  """
  p = common.Parser(prog="features.py", description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--variant", action="append", default=[],
                 help="comma-separated section.key=value overrides; '' is "
                 "the baseline; the first variant is the reference")
  p.add_argument("--variant_set", choices=sorted(VARIANT_SETS),
                 help="a named list of variants, run before any --variant: "
                 + "; ".join(f"{name}: {', '.join(v or 'baseline' for v in vs)}"
                             for name, vs in VARIANT_SETS.items()))
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--warmup", type=int, default=1,
                 help="repeats run first and not counted (process warm-up)")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  for name, least in (("repeats", 1), ("warmup", 0)):
    if getattr(args, name) < least:
      raise common.BadInput(
          f"--{name}={getattr(args, name)} must be >= {least}.")
  args.variants = list(dict.fromkeys(
      VARIANT_SETS.get(args.variant_set, []) + args.variant)) or [""]
  args.configs = {v: variant_config(args.config, args.override,
                                    parse_variant(v), args.steps)
                  for v in args.variants}
  log_every = args.configs[args.variants[0]].train.log_every
  if args.steps < 2 * log_every:
    raise common.BadInput(
        f"--steps={args.steps} must cover at least two log windows (>= "
        f"{2 * log_every}: the first is warm-up); pass --steps="
        f"{2 * log_every} or more, or a smaller --override=train.log_every.")
  # One strategy for all variants: per-call options (runtime.bytes_per_pack,
  # runtime.allreduce_dtype) vary, strategy-level ones must not.
  first = args.configs[args.variants[0]].runtime.strategy
  for v in args.variants:
    if args.configs[v].runtime.strategy != first:
      raise common.BadInput(f"--variant={v!r} changes runtime.strategy; run "
                            "it separately.")
  return args


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except common.BadInput as e:
    return common.fail(PROG, e)
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top
  variants, configs = args.variants, args.configs
  strategy = strategies.get_strategy(configs[variants[0]].runtime)
  chief = strategies.is_chief(strategy)
  results = {v: [] for v in variants}
  for repeat in range(-args.warmup, args.repeats):
    for v in variants:
      result = run_block(configs[v], strategy)
      if repeat >= 0:
        results[v].append(result)
      if chief:
        label = "warm-up" if repeat < 0 else f"{repeat + 1}/{args.repeats}"
        print(f"repeat {label} {v or 'baseline':48} "
              f"{result['examples_per_sec']:10,.0f} ex/s", flush=True)
  if chief:
    report(args, strategy, results)
  return 0


def report(args, strategy, results):
  """Medians per variant and speed relative to the first one."""
  table = {}
  for v, runs in results.items():
    rates = [r["examples_per_sec"] for r in runs]
    table[v or "baseline"] = {
        "examples_per_sec": statistics.median(rates),
        "examples_per_sec_range": [min(rates), max(rates)],
        "eval_accuracy": [r["eval_accuracy"] for r in runs],
        "eval_loss": [r["eval_loss"] for r in runs],
        "sync_fraction": statistics.median(
            r["sync_fraction"] or 0.0 for r in runs),
    }
  reference = next(iter(table.values()))["examples_per_sec"]
  from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top
  print(f"{args.config}: {strategy.num_replicas_in_sync} replicas "
        f"({strategies.display_name(strategy)}), {args.steps} steps x "
        f"{args.repeats} repeats, medians")
  for name, row in table.items():
    row["speed_vs_first"] = row["examples_per_sec"] / reference
    low, high = row["examples_per_sec_range"]
    print(f"  {name:52} {row['examples_per_sec']:10,.0f} ex/s "
          f"({low:,.0f}-{high:,.0f})  "
          f"x{row['speed_vs_first']:.2f}  "
          f"sync {100 * row['sync_fraction']:4.1f}%"
          f"  {_eval_figure(row)}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"config": args.config, "steps": args.steps,
                 "repeats": args.repeats, "overrides": args.override,
                 "replicas": strategy.num_replicas_in_sync,
                 "variants": table}, f, indent=2)


def _eval_figure(row) -> str:
  """The variant's worst eval accuracy, or its worst eval loss (a model
  without an accuracy metric)."""
  if None not in row["eval_accuracy"]:
    return f"eval acc {min(row['eval_accuracy']):.3f}"
  losses = [loss for loss in row["eval_loss"] if loss is not None]
  return f"eval loss {max(losses):.4g}" if losses else "no eval"


if __name__ == "__main__":
  sys.exit(main())
