"""What the sync breakdown costs: the same run with log.sync_timing on and off.

Runs `python -m dist_keras.train` alternately with timing on and off (same
config, data, seed and strategy), REPEATS times each, and prints the median
examples/s of each and the overhead. A benchmark, not a test.

  python tools/sync_overhead.py --config=configs/lstm_longmem.py --repeats=3

Whole runs differ by ~10% here, more than the effect; `--in_process` is the
sharper instrument: in ONE process, blocks of 25 instrumented and 25 plain
steps alternate on the same model and data, and it prints the per-step cost
of instrumenting and what that costs at one instrumented step per log_every.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import train_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run(config, timing: bool, steps: int, extra, root, index) -> float:
  workdir = os.path.join(root, f"{'on' if timing else 'off'}-{index}")
  summary, _ = train_run.train(config, workdir, [
      f"--config.log.sync_timing={timing}", f"--config.train.steps={steps}",
      "--config.eval.every=0", *extra])
  return summary["examples_per_sec"]


def in_process(config_path: str, blocks: int, block_steps: int = 25):
  """Alternates blocks of plain and instrumented steps in this process."""
  sys.path.insert(0, REPO)
  import importlib.util  # pylint: disable=g-import-not-at-top
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    from dist_keras import api, step as step_lib, strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(
      REPO, config_path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.log.progress = False
  strategy = strategy_lib.get_strategy(c.runtime)
  with tempfile.TemporaryDirectory() as workdir:
    with api.build(c.model.name, c.data.name, workdir=workdir, config=c,
                   strategy=strategy) as trainer:
      pass
  it = iter(trainer.train_ds)
  steps = {timed: step_lib.make_train_step(strategy, trainer.model,
                                           trainer.optimizer, timed=timed)
           for timed in (False, True)}
  ms = {False: [], True: []}
  for block in range(blocks + 1):
    for timed in (False, True):
      start = time.perf_counter()
      for _ in range(block_steps):
        steps[timed](it)["loss"].numpy()
      if block:  # Block 0 traces and warms up both functions.
        ms[timed].append(1e3 * (time.perf_counter() - start) / block_steps)
  plain, timed = statistics.median(ms[False]), statistics.median(ms[True])
  extra = (timed - plain) / plain
  print(f"plain step {plain:.2f} ms, instrumented {timed:.2f} ms (medians of "
        f"{blocks} blocks of {block_steps}): {100 * extra:+.1f}% per "
        f"instrumented step, {100 * extra / c.train.log_every:+.2f}% at one "
        f"per log_every={c.train.log_every}")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/lstm_longmem.py")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--override", action="append", default=[])
  p.add_argument("--in_process", action="store_true")
  p.add_argument("--blocks", type=int, default=8)
  args = p.parse_args()
  if args.in_process:
    in_process(args.config, args.blocks)
    return
  rates = {True: [], False: []}
  with tempfile.TemporaryDirectory() as root:
    for i in range(args.repeats):
      for timing in (True, False):  # Alternate: drift hits both alike.
        rates[timing].append(run(args.config, timing, args.steps,
                                 args.override, root, i))
        print(f"run {i} timing {'on ' if timing else 'off'}: "
              f"{rates[timing][-1]:,.0f} examples/s", flush=True)
  on, off = statistics.median(rates[True]), statistics.median(rates[False])
  print(f"median examples/s: timing on {on:,.0f}, off {off:,.0f}; "
        f"overhead {100 * (off - on) / off:+.1f}%")


if __name__ == "__main__":
  main()
