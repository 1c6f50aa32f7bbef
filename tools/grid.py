"""A grid of training runs, one process each, and one row of figures per run.

Every combination of the --config list and the --grid values trains with
`python -m dist_keras.train`, each in its own process and workdir
(calibration and progress lines off). One row per run, printed as it ends:
the final eval accuracy; with --target, the first eval step whose accuracy
reached it (from the run's eval/accuracy TensorBoard scalars); examples/s;
the in-graph step time and the input wait of the instrumented steps
(sync/step_ms, sync/input_wait_ms) with the wait's share of it; the
wall-clock ms per step and the wait's share of that; the run's wall
seconds. A benchmark, not a test.

  # LSTM vs GRU vs SimpleRNN as the sequence grows: steps to 95% eval
  python tools/grid.py --config=lstm_longmem --target=0.95 \\
      --grid=model.cell=lstm,simple_rnn,gru --grid=data.seq_len=50,200 \\
      --override=train.steps=1000 --override=eval.every=50
  # How long the replicas wait for input, config by config
  python tools/grid.py --mock_tfds --override=train.steps=150 \\
      --config=cnn_cifar10,cnn_mnist,cnn_shapes,lstm_imdb,rnn_longmem

--mock_tfds: TFDS configs read `tfds.testing.mock_data` (random examples
with the dataset's real features, made in the input pipeline; no download),
so their input wait covers dist_keras's preprocessing, batching and
prefetching, not disk reads. Exit status: 0 every run finished; 1 some run
failed (its last stderr line is in its row; the grid went on); 2 bad
arguments (one line, nothing run).
"""
import contextlib
import itertools
import os
import shutil
import sys
import tempfile

import common
from common import BadInput

PROG = "grid"
# The child process of a --mock_tfds run: `grid.py MOCK_CHILD=DATA_NAME
# TRAIN_ARGS...` runs dist_keras.train's command line under mock_data.
MOCK_CHILD = "--mock_tfds_child"
MOCK_EXAMPLES = 4096


def parser() -> common.Parser:
  p = common.Parser(prog="grid.py", description=__doc__.splitlines()[0])
  p.add_argument("--config", default="lstm_longmem",
                 help="Comma-separated configs, each a built-in name or a "
                 "config file (default %(default)s).")
  p.add_argument("--grid", action="append", default=[],
                 metavar="SECTION.KEY=V1,V2,...",
                 help="A config key and its values; every combination of "
                 "every --grid trains (repeatable).")
  p.add_argument("--override", action="append", default=[],
                 metavar="SECTION.KEY=VALUE",
                 help="A config override for every run (repeatable).")
  p.add_argument("--target", type=float,
                 help="Report the first eval step whose accuracy reached "
                 "this (set eval.every for a finer curve).")
  p.add_argument("--mock_tfds", action="store_true",
                 help="TFDS configs read tfds.testing.mock_data: no "
                 "download, no prepared data needed.")
  p.add_argument("--root", help="Keep the runs here (must be new or empty; "
                 "default: a temporary folder).")
  p.add_argument("--out", help="Write the rows here as JSON, after every "
                 "run.")
  return p


def parse_grid(texts: list[str]) -> list[tuple[str, list[str]]]:
  """["model.cell=lstm,gru"] -> [("model.cell", ["lstm", "gru"])]."""
  grid = []
  for text in texts:
    key, _, values = text.partition("=")
    if not values:
      raise BadInput(f"--grid={text} is not SECTION.KEY=V1,V2,... (e.g. "
                     "--grid=model.cell=lstm,gru).")
    grid.append((key, values.split(",")))
  return grid


def plan(args) -> list[dict]:
  """Every run: {"config", "overrides" (the grid's), "data"}, each checked.

  Raises:
    BadInput: naming the bad config, override or grid value; nothing ran.
  """
  grid = parse_grid(args.grid)
  runs = []
  for spec in args.config.split(","):
    common.load_config(spec, args.override)  # A bad override, as one.
    for values in itertools.product(*(v for _, v in grid)):
      point = [f"{key}={value}" for (key, _), value in zip(grid, values)]
      config = common.load_config(spec, [*args.override, *point], "--grid ")
      runs.append({"config": spec, "overrides": point,
                   "data": config.data.name})
  return runs


def label(run: dict) -> str:
  """'lstm_longmem cell=gru seq_len=200': the config, then the grid's
  values by their key's last part."""
  return " ".join([run["config"], *(o.split(".", 1)[1]
                                    for o in run["overrides"])])


def train(run: dict, args, workdir: str) -> dict:
  """Trains one run; its figures (RunFailed if it failed)."""
  entry = ((os.path.abspath(__file__), f"{MOCK_CHILD}={run['data']}")
           if args.mock_tfds else common.TRAINER)
  try:
    summary, seconds = common.train(
        run["config"], workdir,
        [f"--config.{o}" for o in (*args.override, *run["overrides"])], entry)
  finally:
    if args.mock_tfds:
      shutil.rmtree(_mock_data_dir(workdir), ignore_errors=True)
  curve = eval_curve(workdir) if args.target is not None else []
  reached = [step for step, acc in curve if acc >= args.target]
  rate, wait, step = (summary["examples_per_sec"],
                      summary.get("input_wait_ms"), summary.get("step_ms"))
  # Host overhead included: what the in-graph step (sync/step_ms) leaves out.
  wall = 1e3 * summary["global_batch_size"] / rate if rate else None
  return {"eval_accuracy": summary.get("eval_accuracy"),
          "steps_to_target": reached[0] if reached else None,
          "examples_per_sec": rate, "step_ms": step, "input_wait_ms": wait,
          "input_share_of_step": _share(wait, step), "wall_step_ms": wall,
          "input_share_of_wall": _share(wait, wall), "wall_s": seconds,
          "eval_curve": curve}


def _share(part, whole) -> float | None:
  return part / whole if part is not None and whole else None


def eval_curve(workdir: str) -> list:
  """[(step, eval accuracy), ...] from the run's TensorBoard scalars."""
  from dist_keras import quiet  # pylint: disable=g-import-not-at-top
  with quiet.startup_lines_filtered():
    from dist_keras import tensorboard_events  # pylint: disable=g-import-not-at-top
  return tensorboard_events.read_scalars(workdir).get("eval/accuracy", [])


# The table: (heading, key of a run's figures, format, width).
COLUMNS = (("eval acc", "eval_accuracy", ".4f", 8),
           ("ex/s", "examples_per_sec", ",.0f", 8),
           ("step ms", "step_ms", ".1f", 8),
           ("input ms", "input_wait_ms", ".2f", 8),
           ("% step", "input_share_of_step", ".1%", 6),
           ("wall ms", "wall_step_ms", ".1f", 8),
           ("% wall", "input_share_of_wall", ".1%", 6),
           ("wall s", "wall_s", ".0f", 6))


def columns(target) -> tuple:
  """COLUMNS, with steps to --target after the accuracy ("-": never)."""
  if target is None:
    return COLUMNS
  return (COLUMNS[0], (f"steps to {target:g}", "steps_to_target", "d", 13),
          *COLUMNS[1:])


def line(name: str, width: int, cells) -> str:
  """One line of the table: `name`, then (text or value, format, width)."""
  return " ".join([f"{name:<{width}}", *(
      f"{'-' if v is None else format(v, spec):>{w}}" for v, spec, w in cells)])


def sweep(runs: list[dict], args, root: str) -> list[dict]:
  """Trains every run in turn, printing its row; returns the rows."""
  width = max(len(label(r)) for r in runs)
  table = columns(args.target)
  print(line("run", width, ((h, "", w) for h, _, _, w in table)), flush=True)
  rows = []
  for i, run in enumerate(runs):
    result = {"run": label(run), "config": run["config"],
              "overrides": run["overrides"]}
    try:
      result.update(train(run, args, os.path.join(root, f"run{i}")))
      print(line(label(run), width, ((result[k], spec, w)
                                     for _, k, spec, w in table)), flush=True)
    except common.RunFailed as e:
      result["failed"] = str(e).strip().splitlines()[-1]
      print(f"{label(run):<{width}} failed: {result['failed']}", flush=True)
    rows.append(result)
    if args.out:
      common.write_json(args.out, rows)  # Whole after every run.
  return rows


def mock_child(data_name: str, argv: list[str]) -> None:
  """Runs dist_keras.train's command line `argv` (and exits with its status),
  a TFDS dataset served by tfds.testing.mock_data from a scratch data_dir."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from dist_keras import train  # pylint: disable=g-import-not-at-top
  from dist_keras.data import tfds_sources  # pylint: disable=g-import-not-at-top
  with contextlib.ExitStack() as stack:
    if tfds_sources.is_tfds(data_name):
      # Beside the workdir, removed by the parent (train): train.run ends
      # this process with os._exit, which no cleanup here would outlive.
      (workdir,) = [a.split("=", 1)[1] for a in argv
                    if a.startswith("--workdir=")]
      data_dir = _mock_data_dir(workdir)
      stack.enter_context(_mock_data(tfds_sources.dataset_name(data_name),
                                     data_dir))
      argv = [*argv, f"--config.data.data_dir={data_dir}"]
    sys.argv = ["dist_keras.train", *argv]
    train.run()


def _mock_data_dir(workdir: str) -> str:
  """Where a mock child's data_dir is: beside its workdir."""
  return workdir.rstrip("/") + ".mock_tfds"


def _mock_data(name: str, data_dir: str):
  """tfds.testing.mock_data for dataset `name`, its metadata on disk (the
  trainer checks the dataset is prepared)."""
  # pylint: disable=g-import-not-at-top
  import mock_tfds
  import numpy as np
  import tensorflow as tf
  import tensorflow_datasets as tfds
  # pylint: enable=g-import-not-at-top
  mock_tfds.write_metadata(name, data_dir, MOCK_EXAMPLES)
  kwargs = {}
  if name == "tiny_shakespeare":
    # Mock strings are a few bytes long: give the LM one long random text
    # per split, as the real dataset has (~1 MB train).
    text = np.random.default_rng(0).integers(32, 127, 1 << 20).astype(
        np.uint8).tobytes()
    kwargs["as_dataset_fn"] = lambda *a, **k: tf.data.Dataset.from_tensors(
        {"text": tf.constant(text)})
  return tfds.testing.mock_data(num_examples=MOCK_EXAMPLES,
                                data_dir=data_dir, **kwargs)


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0].startswith(MOCK_CHILD + "="):
    mock_child(argv[0].split("=", 1)[1], argv[1:])  # Exits.
  try:
    args = parser().parse_args(argv)
    runs = plan(args)
    common.require_empty("--root", args.root)
  except BadInput as e:
    return common.fail(PROG, e)
  with tempfile.TemporaryDirectory() as scratch:
    rows = sweep(runs, args, args.root or scratch)
  return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
