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
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import config_args  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_variant(text: str) -> list[str]:
  """'a.b=1,c.d=x' -> ['a.b=1', 'c.d=x']; '' (the baseline) -> []."""
  return [part.strip() for part in text.split(",") if part.strip()]


def variant_config(name: str, overrides, variant, steps: int):
  """The config of one block: `name` + overrides + variant, timed like a
  real run, with nothing but training in the block."""
  from dist_keras import configs  # pylint: disable=g-import-not-at-top
  c = configs.load(name, [*overrides, *variant])
  c.train.steps = steps
  c.train.checkpoint_every = steps
  c.eval.every, c.eval.steps = 0, 2
  c.log.calibration_steps, c.log.progress = 0, False
  c.log.tensorboard = False
  return c


def run_block(c, strategy, loop) -> dict:
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  del loop  # The run goes through the public path, like a user's.
  with tempfile.TemporaryDirectory() as workdir:
    summary = api.fit(c.model.name, c.data.name, workdir=workdir, config=c,
                      strategy=strategy).summary
  return {k: summary[k] for k in ("examples_per_sec", "eval_accuracy",
                                  "train_loss", "sync_fraction")}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="lstm_longmem")
  p.add_argument("--variant", action="append", default=[],
                 help="comma-separated section.key=value overrides; '' is "
                 "the baseline; the first variant is the reference")
  p.add_argument("--override", action="append", default=[],
                 help="section.key=value applied to every variant")
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--warmup", type=int, default=1,
                 help="repeats run first and not counted (process warm-up)")
  p.add_argument("--out", default="")
  args = p.parse_args()
  args.config = config_args.checked(p, args.config, args.override)
  for v in args.variant:
    config_args.checked(p, args.config, parse_variant(v), "--variant ")
  variants = args.variant or [""]
  if args.steps < 2 * 25 or args.repeats < 1:
    p.error(f"--steps={args.steps} must cover at least two log windows "
            f"(>= 50) and --repeats={args.repeats} must be >= 1")
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    from dist_keras import loop, strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  configs = {v: variant_config(args.config, args.override, parse_variant(v),
                               args.steps) for v in variants}  # Checked first.
  strategy = strategy_lib.get_strategy(configs[variants[0]].runtime)
  chief = loop.is_chief(strategy)
  # One strategy for all variants: per-call options (runtime.bytes_per_pack,
  # runtime.allreduce_dtype) vary, strategy-level ones must not.
  for v in variants:
    if configs[v].runtime.strategy != configs[variants[0]].runtime.strategy:
      p.error(f"--variant={v!r} changes runtime.strategy; run it separately")
  results = {v: [] for v in variants}
  for repeat in range(-args.warmup, args.repeats):
    for v in variants:
      result = run_block(configs[v], strategy, loop)
      if repeat >= 0:
        results[v].append(result)
      if chief:
        label = "warm-up" if repeat < 0 else f"{repeat + 1}/{args.repeats}"
        print(f"repeat {label} {v or 'baseline':48} "
              f"{result['examples_per_sec']:10,.0f} ex/s", flush=True)
  if chief:
    report(args, strategy, results)


def report(args, strategy, results):
  """Medians per variant and speed relative to the first one."""
  table = {}
  for v, runs in results.items():
    rates = [r["examples_per_sec"] for r in runs]
    table[v or "baseline"] = {
        "examples_per_sec": statistics.median(rates),
        "examples_per_sec_range": [min(rates), max(rates)],
        "eval_accuracy": [r["eval_accuracy"] for r in runs],
        "sync_fraction": statistics.median(
            r["sync_fraction"] or 0.0 for r in runs),
    }
  reference = next(iter(table.values()))["examples_per_sec"]
  from dist_keras import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  print(f"{args.config}: {strategy.num_replicas_in_sync} replicas "
        f"({strategy_lib.display_name(strategy)}), {args.steps} steps x {args.repeats} "
        "repeats, medians")
  for name, row in table.items():
    row["speed_vs_first"] = row["examples_per_sec"] / reference
    low, high = row["examples_per_sec_range"]
    print(f"  {name:52} {row['examples_per_sec']:10,.0f} ex/s "
          f"({low:,.0f}-{high:,.0f})  "
          f"x{row['speed_vs_first']:.2f}  sync {100 * row['sync_fraction']:4.1f}%"
          f"  eval acc {min(row['eval_accuracy']):.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"config": args.config, "steps": args.steps,
                 "repeats": args.repeats, "overrides": args.override,
                 "replicas": strategy.num_replicas_in_sync,
                 "variants": table}, f, indent=2)


if __name__ == "__main__":
  main()
