"""Does k times the global batch, at the same epochs, reach the base accuracy?

For each seed, trains a config at its own global batch B for S steps (the
base), then at k*B for S/k steps (the same examples: the same epochs) once per
learning-rate rule (`train.lr_scaling` with `train.warmup_steps`, Goyal et
al. 2017), each run its own `python -m dist_keras.train` process, evaluated
once at its end. Prints each run as it ends, then per rule its accuracies,
the gap to the base's mean and whether every seed is within the tolerance.
A benchmark, not a test: it prints figures.

  python tools/large_batch.py --config=lstm_longmem --k=8 --seeds=0,1,2 \\
      --rules=none:0,linear:20 --out=/tmp/large_batch.json

`--override` applies to every run (e.g. `--override=train.optimizer=sgd`);
`--scale_steps=4` lengthens the schedule of base and large runs alike.
"""
import os
import statistics
import sys
import tempfile

import common
from common import BadInput

from dist_keras import validate

PROG = "large_batch"
SCALINGS = validate.LR_SCALINGS


def parser() -> common.Parser:
  p = common.Parser(prog="large_batch.py",
                    description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--k", type=int, default=8,
                 help="Large global batch = k x the config's.")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--rules", default="none:0,linear:20",
                 help="RULE:WARMUP_STEPS pairs for the large batch, RULE "
                 f"one of {', '.join(SCALINGS)}.")
  p.add_argument("--scale_steps", type=float, default=1.0,
                 help="Multiply the config's train.steps by this (both runs).")
  p.add_argument("--tolerance", type=float, default=0.01,
                 help="Largest accepted drop below the base's mean accuracy.")
  p.add_argument("--root", help="Keep the runs here (must be empty or new; "
                 "default: a temporary folder).")
  p.add_argument("--out", help="Write the results here as JSON, after every "
                 "run (an interrupted sweep keeps what it finished).")
  return p


# Keys each run sets for itself; train.global_batch_size and train.steps
# may be overridden: they are the base run's.
RUN_KEYS = {"runtime.seed": "--seeds", "train.base_batch_size": "--k",
            "train.lr_scaling": "--rules", "train.warmup_steps": "--rules",
            "eval.every": None, "train.checkpoint_every": None}


def parse_rules(text: str) -> list[tuple[str, int]]:
  """"linear:20,none:0" -> [("linear", 20), ("none", 0)]."""
  rules = []
  for item in text.split(","):
    rule, _, warmup = item.partition(":")
    if rule not in SCALINGS or not warmup.isdigit():
      raise BadInput(f"--rules item {item!r} is not RULE:WARMUP_STEPS with "
                     f"RULE one of {', '.join(SCALINGS)}; e.g. "
                     "--rules=linear:20.")
    if rule == "none" and int(warmup):
      raise BadInput(f"--rules item {item!r}: warmup ramps to a scaled rate, "
                     "so 'none' takes warmup 0.")
    rules.append((rule, int(warmup)))
  return rules


def plan(args) -> dict:
  """The base and large schedules.

  Raises:
    BadInput: an argument that cannot run.
  """
  common.refuse_run_keys(args.override, RUN_KEYS)
  config = common.load_config(args.config, args.override)
  if args.k < 2:
    raise BadInput(f"--k={args.k} must be >= 2 (the large batch is k x the "
                   "base).")
  try:
    seeds = [int(s) for s in args.seeds.split(",")]
  except ValueError:
    raise BadInput(f"--seeds={args.seeds!r} is not a comma-separated list of "
                   "integers.") from None
  rules = parse_rules(args.rules)
  batch = config.train.global_batch_size
  base_steps = round(config.train.steps * args.scale_steps)
  large_steps = base_steps // args.k
  if large_steps < 1:
    raise BadInput(f"{base_steps} base steps / k={args.k} leave no "
                   "large-batch step; raise --scale_steps.")
  for rule, warmup in rules:
    if warmup > large_steps:
      raise BadInput(f"--rules {rule}:{warmup}: warmup is longer than the "
                     f"{large_steps} large-batch steps; use at most "
                     f"{large_steps}.")
  return {"config": args.config, "k": args.k, "seeds": seeds, "rules": rules,
          "batch": batch, "base_steps": base_steps, "large_steps": large_steps,
          "learning_rate": config.train.learning_rate,
          "optimizer": config.train.optimizer}


def run_overrides(p: dict, seed: int, batch: int, steps: int,
                  rule: str = "none", warmup: int = 0) -> list[str]:
  return [f"--config.runtime.seed={seed}",
          f"--config.train.global_batch_size={batch}",
          f"--config.train.steps={steps}",
          # The base batch is the config's, whatever its base_batch_size.
          f"--config.train.base_batch_size={p['batch']}",
          f"--config.train.lr_scaling={rule}",
          f"--config.train.warmup_steps={warmup}",
          # One evaluation and one checkpoint, at the end: the question is
          # the final accuracy, and the large runs have few steps to spend.
          "--config.eval.every=0", f"--config.train.checkpoint_every={steps}"]


def run(p: dict, args, root: str, name: str, overrides: list[str]) -> dict:
  # The run's own settings last: absl keeps the last value of a flag, and
  # the user's global_batch_size and steps are the base run's.
  summary, seconds = common.train(
      p["config"], os.path.join(root, name),
      [f"--config.{o}" for o in args.override] + overrides)
  return {"name": name, "eval_accuracy": summary["eval_accuracy"],
          "train_loss": summary["train_loss"], "wall_s": seconds,
          "peak_learning_rate": summary.get("peak_learning_rate")}


def verdicts(p: dict, results: dict, tolerance: float) -> list[dict]:
  """Per rule: accuracies, gap of the mean and of the worst seed to the
  base's mean, and whether every seed is within `tolerance`."""
  base = statistics.mean(r["eval_accuracy"] for r in results["base"])
  rows = []
  for rule, warmup in p["rules"]:
    accs = [r["eval_accuracy"] for r in results[f"{rule}:{warmup}"]]
    if not accs:
      continue
    rows.append({"rule": rule, "warmup": warmup, "accuracies": accs,
                 "mean_gap": statistics.mean(accs) - base,
                 "worst_gap": min(accs) - base,
                 "within": min(accs) >= base - tolerance,
                 "complete": len(accs) == len(p["seeds"])})
  return rows


def print_verdicts(p: dict, results: dict, tolerance: float) -> None:
  base = [r["eval_accuracy"] for r in results["base"]]
  print(f"\n{p['config']}: base batch {p['batch']} x {p['base_steps']} steps "
        f"-> {', '.join(f'{a:.3f}' for a in base)} (mean "
        f"{statistics.mean(base):.3f}); {p['k']}x batch "
        f"{p['batch'] * p['k']} x {p['large_steps']} steps:")
  print(f"{'rule':<7} {'warmup':>6} {'eval accuracy per seed':<26} "
        f"{'mean gap':>9} {'worst gap':>9}  within {tolerance * 100:g} pt")
  for v in verdicts(p, results, tolerance):
    accs = ", ".join(f"{a:.3f}" for a in v["accuracies"])
    within = "yes" if v["within"] else "no"
    if not v["complete"]:
      within += f" ({len(v['accuracies'])} of {len(p['seeds'])} seeds)"
    print(f"{v['rule']:<7} {v['warmup']:>6} {accs:<26} "
          f"{v['mean_gap'] * 100:>+8.1f}p {v['worst_gap'] * 100:>+8.1f}p  "
          f"{within}")


def save(path, p, results, tolerance) -> None:
  if not path:
    return
  document = {"plan": p, "runs": results, "tolerance": tolerance,
              "verdicts": verdicts(p, results, tolerance)
                          if results["base"] else []}
  common.write_json(path, document)  # Never a half-written file.


def sweep(p: dict, args, root: str) -> dict:
  results = {"base": [], **{f"{r}:{w}": [] for r, w in p["rules"]}}
  print(f"{'run':<28} {'eval acc':>8} {'train loss':>10} {'peak lr':>9} "
        f"{'wall s':>7}", flush=True)
  for seed in p["seeds"]:
    jobs = [("base", f"base-s{seed}",
             run_overrides(p, seed, p["batch"], p["base_steps"]))]
    for rule, warmup in p["rules"]:
      jobs.append((f"{rule}:{warmup}", f"{rule}-w{warmup}-s{seed}",
                   run_overrides(p, seed, p["batch"] * p["k"],
                                 p["large_steps"], rule, warmup)))
    for key, name, overrides in jobs:
      print(f"{name:<28}", end=" ", flush=True)  # Runs take minutes.
      row = run(p, args, root, name, overrides)
      results[key].append(row)
      peak = row["peak_learning_rate"] or p["learning_rate"]
      print(f"{row['eval_accuracy']:>8.4f} "
            f"{row['train_loss']:>10.4f} {peak:>9.4g} {row['wall_s']:>7.0f}",
            flush=True)
      save(args.out, p, results, args.tolerance)
  return results


def main(argv=None) -> int:
  try:
    args = parser().parse_args(argv)
    p = plan(args)
    common.require_empty("--root", args.root)
  except BadInput as e:
    return common.fail(PROG, e)  # One line, exit 2, nothing run.
  print(f"{p['config']} ({p['optimizer']}, learning rate "
        f"{p['learning_rate']:g} for batch {p['batch']}): seeds "
        f"{p['seeds']}, k={p['k']}", flush=True)
  with tempfile.TemporaryDirectory() as scratch:
    results = sweep(p, args, args.root or scratch)
  print_verdicts(p, results, args.tolerance)
  return 0


if __name__ == "__main__":
  sys.exit(main())
