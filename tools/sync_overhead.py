"""What the sync breakdown costs: the same run with log.sync_timing on and off.

Runs `python -m dist_keras.train` alternately with timing on and off (same
config, data, seed and strategy), REPEATS times each, and prints the median
examples/s of each and the overhead. A benchmark, not a test.

  python tools/sync_overhead.py --config=configs/lstm_longmem.py --repeats=3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(config, timing: bool, steps: int, extra, root, index) -> float:
  workdir = os.path.join(root, f"{'on' if timing else 'off'}-{index}")
  command = [sys.executable, "-m", "dist_keras.train", f"--config={config}",
             f"--workdir={workdir}", f"--config.log.sync_timing={timing}",
             f"--config.train.steps={steps}", "--config.eval.every=0",
             "--config.log.calibration_steps=0", "--config.log.progress=False",
             *extra]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          check=False)
  if result.returncode:
    raise SystemExit(result.stderr[-2000:])
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)["examples_per_sec"]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/lstm_longmem.py")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--override", action="append", default=[])
  args = p.parse_args()
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
