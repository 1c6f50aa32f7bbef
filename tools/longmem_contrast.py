"""LSTM vs GRU vs SimpleRNN on the long-memory task, over sequence lengths.

Runs `python -m dist_keras.train` once per (cell, seq_len, seed), each in its
own process, and prints how many steps each needed to reach the target eval
accuracy (from the run's `eval/accuracy` TensorBoard scalars), its final eval
accuracy and its wall time. A benchmark, not a test: it prints figures.

  python tools/longmem_contrast.py --cells=lstm,simple_rnn --seq_lens=50,200 \
      --seeds=0 --steps=1000 --out=/tmp/contrast.json
"""
import argparse
import json
import os
import sys
import tempfile

import train_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dist_keras import quiet  # pylint: disable=g-import-not-at-top,wrong-import-position

with quiet.startup_lines_filtered():
  from dist_keras import summaries  # pylint: disable=g-import-not-at-top


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cells", default="lstm,simple_rnn")
  p.add_argument("--seq_lens", default="50,200")
  p.add_argument("--seeds", default="0")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--eval_every", type=int, default=50)
  p.add_argument("--target", type=float, default=0.95)
  p.add_argument("--out", help="Write the results here as JSON.")
  p.add_argument("--override", action="append", default=[],
                 help="Extra --config.KEY=VALUE for every run (repeatable).")
  return p.parse_args(argv)


def run_one(cell, seq_len, seed, args, root) -> dict:
  """Trains one configuration; returns its figures."""
  workdir = os.path.join(root, f"{cell}-T{seq_len}-s{seed}")
  summary, seconds = train_run.train("configs/lstm_longmem.py", workdir, [
      f"--config.model.cell={cell}", f"--config.data.seq_len={seq_len}",
      f"--config.runtime.seed={seed}", f"--config.train.steps={args.steps}",
      f"--config.eval.every={args.eval_every}", *args.override])
  curve = summaries.read_scalars(workdir)["eval/accuracy"]
  reached = [step for step, acc in curve if acc >= args.target]
  return {"cell": cell, "seq_len": seq_len, "seed": seed,
          "steps_to_target": reached[0] if reached else None,
          "eval_accuracy": summary["eval_accuracy"], "wall_s": seconds,
          "examples_per_sec": summary["examples_per_sec"], "curve": curve}


def main(argv=None):
  args = parse_args(argv)

  rows = []
  print(f"{'cell':<11} {'T':>4} {'seed':>4} {'steps to ' + str(args.target):>14}"
        f" {'final acc':>9} {'wall s':>7} {'ex/s':>7}", flush=True)
  with tempfile.TemporaryDirectory() as root:
    for seq_len in [int(t) for t in args.seq_lens.split(",")]:
      for cell in args.cells.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
          row = run_one(cell, seq_len, seed, args, root)
          rows.append(row)
          reached = row["steps_to_target"]
          print(f"{cell:<11} {seq_len:>4} {seed:>4} "
                f"{reached if reached else 'not reached':>14} "
                f"{row['eval_accuracy']:>9.4f} {row['wall_s']:>7.0f} "
                f"{row['examples_per_sec']:>7,.0f}", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
