"""A short run's start-up and ending: Keras' fit against dist_keras.fit.

tools/bench.py times steps (the first epoch or log window dropped); this
times what it drops, as a user running a short job, a sweep's trial or a
notebook cell meets it. Same model, data, global batch and strategy; each
run in a new Python process (this script with --only=SIDE), timed from
before the model is built (TensorFlow imported, the strategy made) to the
end of its first step (a callback) and to the call's return:

  fit              model_fn's model (built in the strategy's scope, as
                   dist_keras builds it), ONE fit call of --steps steps on
                   the train split, validated once at its end on the eval
                   split (none where dataset_fn has none), verbose=0;
  dist_keras       dist_keras.fit of the config (its model.name and
                   data.name), its defaults but train.steps=--steps,
                   eval.every=0 (one eval, at the end) and log.progress
                   off: the MFU peak timed at the start, the calibration
                   after the last step (docs/sync_breakdown.md);
  dist_keras_lean  the same with log.calibration_steps=0 and
                   log.peak_tflops given: the two a user can turn off.

Rounds alternate the sides; printed: each side's median seconds (first
step, whole call) with the rounds' range, and fit's whole call over each
dist_keras side's (>1: dist_keras ends sooner). A benchmark, not a test.

  python tools/bench_startup.py --steps=60 \\
      --override=model.name=bench_models:text_model_fn \\
      --override=data.name=bench_models:text_dataset_fn \\
      --override=train.global_batch_size=64
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
PROG = "bench_startup"
SIDES = ("fit", "dist_keras", "dist_keras_lean")
_RESULT = "startup-run: "  # A --only run's [first step s, call s].
_ERROR = "startup-error: "


def parse_args(argv=None):
  p = common.Parser(prog="bench_startup.py",
                    description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--steps", type=int, default=60,
                 help="steps per run (default %(default)s)")
  p.add_argument("--rounds", type=int, default=3, help="(default %(default)s)")
  p.add_argument("--strategy", default="one", choices=("one", "mirrored"),
                 help="one device (fit without a strategy), or "
                 "MirroredStrategy over runtime.num_cpu_devices (default "
                 "%(default)s)")
  p.add_argument("--only", default="", help=argparse.SUPPRESS)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  for name in ("steps", "rounds"):
    if getattr(args, name) < 1:
      raise common.BadInput(f"--{name}={getattr(args, name)} must be >= 1.")
  if args.only and args.only not in SIDES:
    raise common.BadInput(f"--only={args.only}: use one of {', '.join(SIDES)}.")
  common.load_config(args.config, args.override)  # Fails before a run.
  return args


def run_side(side: str, args) -> tuple[float, float]:
  """(seconds to the first step's end, seconds to the call's return) of one
  `side` run in this process."""
  # pylint: disable=g-import-not-at-top
  import keras
  import tensorflow as tf

  import dist_keras
  from dist_keras import registry
  from dist_keras.contract import checks
  from dist_keras.distribute import strategies
  c = common.load_config(args.config, args.override)
  model_fn, dataset_fn = registry.resolve(c)
  # Split as a dist_keras run splits the CPU, whatever the side.
  mirrored = strategies.get_strategy(c.runtime)
  one = (tf.distribute.get_strategy() if side == "fit"
         else tf.distribute.OneDeviceStrategy("/cpu:0"))
  strategy = mirrored if args.strategy == "mirrored" else one
  first = []

  class FirstStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if not first:
        first.append(time.perf_counter() - start)

  start = time.perf_counter()
  if side == "fit":
    model = checks.call_model_fn(model_fn, strategy, c.train.precision)
    whole = tf.distribute.InputContext()  # One pipeline: global batches.
    model.fit(dataset_fn("train", whole), steps_per_epoch=args.steps,
              epochs=1, validation_data=dataset_fn("eval", whole),
              verbose=0, callbacks=[FirstStep()])
  else:
    c.train.steps, c.eval.every, c.log.progress = args.steps, 0, False
    if side == "dist_keras_lean":
      c.log.calibration_steps = 0
      c.log.peak_tflops = c.log.peak_tflops or 1.0
    with tempfile.TemporaryDirectory() as workdir:
      dist_keras.fit(c.model.name, c.data.name, workdir=workdir, config=c,
                     strategy=strategy, callbacks=[FirstStep()])
  return first[0], time.perf_counter() - start


def fresh_run(side: str, args) -> tuple[float, float]:
  """run_side in a new Python process (common.ChildFailed if it failed)."""
  return tuple(common.child_result(
      [sys.executable, os.path.abspath(__file__), f"--config={args.config}",
       *[f"--override={o}" for o in args.override], f"--steps={args.steps}",
       f"--strategy={args.strategy}", f"--only={side}"], _RESULT, _ERROR))


def report(results: dict, args) -> dict:
  """Prints and returns {side: {first_step_s, call_s, rounds}, ratios}
  from {side: [(first, call) per round]}."""
  out = {"steps": args.steps, "strategy": args.strategy,
         "rounds": args.rounds, "sides": {}, "ratios": {}}
  print(f"{args.steps} steps, {args.strategy}; {args.rounds} round"
        f"{'s' * (args.rounds != 1)} (medians; the rounds' range)")
  for side, rows in results.items():
    first, call = ([r[i] for r in rows] for i in (0, 1))
    out["sides"][side] = {"first_step_s": statistics.median(first),
                          "call_s": statistics.median(call), "rounds": rows}
    print(f"  {side:16} first step {statistics.median(first):6.2f} s "
          f"({min(first):.2f}-{max(first):.2f})  call "
          f"{statistics.median(call):6.2f} s ({min(call):.2f}-{max(call):.2f})")
  fit = out["sides"]["fit"]["call_s"]
  for side in SIDES[1:]:
    out["ratios"][side] = fit / out["sides"][side]["call_s"]
    print(f"  fit / {side} (whole call): {out['ratios'][side]:.2f}x")
  return out


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except common.BadInput as e:
    return common.fail(PROG, e)
  if args.only:  # One run, for the parent.
    try:
      print(_RESULT + json.dumps(run_side(args.only, args)), flush=True)
    except Exception as e:  # pylint: disable=broad-except
      print(_ERROR + common.one_line(e), flush=True)
      return 1
    return 0
  results = {side: [] for side in SIDES}
  for r in range(args.rounds):
    for side in SIDES:
      try:
        results[side].append(fresh_run(side, args))
      except common.ChildFailed as e:  # The run's own failure: exit 1.
        common.say(PROG, f"error: {side}: {e}")
        return 1
      common.say(PROG, f"round {r + 1}/{args.rounds}: {side}: "
                 f"{results[side][-1][1]:.2f} s")
  out = report(results, args)
  if args.out:
    common.write_json(args.out, out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
