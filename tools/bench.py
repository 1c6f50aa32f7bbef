"""dist_keras's loop against Keras' own fit: same model, data, batch, strategy.

In ONE process, after a warm-up of each, blocks of STEPS steps alternate
between (a) Keras `model.fit` with no strategy (one device), (b) `model.fit`
under MirroredStrategy, (c) dist_keras's loop under the same strategy with
its sync timing as in a real run (one instrumented step per
train.log_every), (d) the same loop with timing off, and (e) the loop on one
device (OneDeviceStrategy), the counterpart of (a). Prints the median
ms/step and examples/s of each and the ratios the README quotes; writes
JSON. A benchmark, not a test.

  python tools/bench.py --config=lstm_longmem --repeats=5 --out=bench.json

"timing overhead" is (c) against (d). With --override=train.log_every=1
every step of (c) is instrumented, so it is the cost of one instrumented
step; the default log_every gives what a real run pays.
"""
import json
import os
import statistics
import sys
import tempfile
import time

import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PROG = "bench"


def keras_fit_block(c, strategy, data_lib, models):
  """A `(steps) -> seconds` running model.fit for `steps` steps."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = data_lib.input_spec(c.data, models.inputs(c.model))
  with strategy.scope():
    keras.utils.set_random_seed(c.runtime.seed)
    # The built-in model_fn: the model and compile dist_keras trains.
    model = models.model_fn(c, spec)()
  # The same examples, shuffled and batched globally, as fit expects.
  fn = data_lib.dataset_fn(c, spec)
  ds = fn("train", tf.distribute.InputContext()).unbatch().batch(
      c.train.global_batch_size, drop_remainder=True).prefetch(
          tf.data.AUTOTUNE)

  def run(steps):
    start = time.perf_counter()
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
    return time.perf_counter() - start

  return run


def loop_block(c, strategy, sync_timing):
  """A `(steps) -> seconds` running dist_keras's steps as its loop does."""
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  from dist_keras.measure import breakdown as breakdown_lib  # pylint: disable=g-import-not-at-top
  from dist_keras.training import step as step_lib  # pylint: disable=g-import-not-at-top
  c.log.sync_timing = sync_timing
  with tempfile.TemporaryDirectory() as workdir:
    with api.build(c, workdir, strategy=strategy) as trainer:
      pass
  log_every = c.train.log_every
  iterator = iter(trainer.parts.train_ds)
  steps_fn = {timed: step_lib.make_train_step(
      strategy, trainer.model, trainer.optimizer, timed=timed)
              for timed in (False, True)}
  done = [0]

  def run(steps):
    start = time.perf_counter()
    for _ in range(steps):
      done[0] += 1
      timed = sync_timing and done[0] % log_every == 0
      out = steps_fn[timed](iterator)
      out["loss"].numpy()  # The loop reads the loss every step.
      if timed:
        breakdown_lib.breakdown(
            out["step_start"].numpy(), out["inputs_ready"].numpy(),
            out["stamps"].numpy(), out["collective_waits"].numpy())
    return time.perf_counter() - start

  return run


def parse_args(argv=None):
  p = common.Parser(prog="bench.py", description=__doc__.splitlines()[0])
  common.add_config_args(p)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--steps", type=int, default=50, help="steps per block")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  common.load_config(args.config, args.override)  # Fails before any run.
  return args


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
  except common.BadInput as e:
    return common.fail(PROG, e)
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras import data as data_lib  # pylint: disable=g-import-not-at-top
  from dist_keras import models  # pylint: disable=g-import-not-at-top
  from dist_keras.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  def config():  # A fresh config per block: each sets its own keys.
    return common.load_config(args.config, args.override)

  c = config()
  mirrored = strategy_lib.get_strategy(c.runtime)
  one = tf.distribute.get_strategy()  # The default: no strategy.
  blocks = {
      "fit, no strategy": keras_fit_block(config(), one, data_lib, models),
      "fit, Mirrored": keras_fit_block(config(), mirrored, data_lib, models),
      "dist_keras": loop_block(config(), mirrored, sync_timing=True),
      "dist_keras, timing off": loop_block(config(), mirrored,
                                           sync_timing=False),
      # The price of being distributed: the same loop on one device.
      "dist_keras, one device": loop_block(
          config(), tf.distribute.OneDeviceStrategy("/cpu:0"),
          sync_timing=True),
  }
  for run in blocks.values():  # Warm-up: tracing, autotuning.
    run(args.steps)
  seconds = {name: [] for name in blocks}
  for _ in range(args.repeats):
    for name, run in blocks.items():  # Alternating: drift hits all alike.
      seconds[name].append(run(args.steps))
  gb = c.train.global_batch_size
  result = {"config": args.config, "replicas": mirrored.num_replicas_in_sync,
            "global_batch_size": gb, "steps_per_block": args.steps,
            "repeats": args.repeats, "ms_per_step": {}}
  print(f"{args.config}: {mirrored.num_replicas_in_sync} replicas, global "
        f"batch {gb}, {args.repeats} x {args.steps} steps each (medians)")
  result["ms_per_step_quartiles"] = {}
  for name, values in seconds.items():
    ms = 1e3 * statistics.median(values) / args.steps
    result["ms_per_step"][name] = ms
    # The spread of the blocks: how far one block's figure can be trusted.
    q1, _, q3 = (1e3 * q / args.steps for q in statistics.quantiles(
        values, n=4)) if len(values) > 1 else (ms, ms, ms)
    result["ms_per_step_quartiles"][name] = [q1, q3]
    print(f"  {name:24} {ms:8.2f} ms/step {1e3 * gb / ms:10,.0f} ex/s  "
          f"(quartiles {q1:.2f}-{q3:.2f})")
  ms = result["ms_per_step"]
  result["ratios"] = {
      "dist_keras / fit, Mirrored (speed)": ms["fit, Mirrored"]
                                            / ms["dist_keras"],
      "one device: dist_keras / fit, no strategy (speed)": (
          ms["fit, no strategy"] / ms["dist_keras, one device"]),
      "timing overhead": ms["dist_keras"] / ms["dist_keras, timing off"] - 1,
  }
  for name, value in result["ratios"].items():
    print(f"  {name:40} {value:6.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
