"""Downloads and prepares a TFDS dataset into a data_dir, explicitly.

Training never downloads (unless data.download=True): run this once, on a
machine with network, then train with --config.data.data_dir=DIR (or copy DIR
to the training machines, or prepare straight into gs://BUCKET/DIR).

  python -m dist_keras.prepare_data mnist --data_dir ~/tensorflow_datasets
  python -m dist_keras.prepare_data tfds:cifar10 --data_dir gs://my-bucket/tfds
  # ImageNet cannot be downloaded by TFDS: fetch ILSVRC2012_img_train.tar and
  # ILSVRC2012_img_val.tar from image-net.org into MANUAL first.
  python -m dist_keras.prepare_data imagenet2012 --data_dir DIR \\
      --manual_dir MANUAL

TFDS's download_and_prepare, as `tfds build NAME --data_dir DIR` would be
(tensorflow-datasets 4.9.10's `tfds` command fails at start without
apache_beam). Progress bars come from TFDS. Exit status: 0 prepared (or
already prepared); 2 on any failure, with one line on stderr.
"""
import sys

from dist_keras import commands, terminal
from dist_keras.errors import UserError

PROG = "prepare_data"
EXIT_FAILED = 2


def parse_args(argv):
  parser = commands.Parser(prog="python -m dist_keras.prepare_data",
                           description=__doc__.splitlines()[0])
  parser.add_argument("name", help="TFDS name, e.g. mnist or tfds:mnist")
  parser.add_argument("--data_dir", default="",
                      help="where to prepare it; '' = ~/tensorflow_datasets")
  parser.add_argument("--manual_dir", default="",
                      help="manually downloaded files (imagenet2012)")
  return parser.parse_args(argv)


def prepare(name: str, data_dir: str = "", manual_dir: str = "") -> str:
  """Prepares `name` into `data_dir`; returns the prepared version's folder."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if name.startswith("tfds:"):
    name = name[len("tfds:"):]
  builder = tfds.builder(name, data_dir=data_dir or None)
  if not builder.is_prepared():
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=manual_dir or None))
  return str(builder.data_path)


def main(argv=None) -> int:
  try:
    args = parse_args(sys.argv[1:] if argv is None else argv)
  except UserError as e:
    return commands.fail(PROG, e)
  try:
    path = prepare(args.name, args.data_dir, args.manual_dir)
  except Exception as e:  # pylint: disable=broad-except
    # Whatever went wrong (no network, no such dataset, no manual files), the
    # user gets its first line, not a traceback through TFDS's internals.
    first = (str(e).strip().splitlines() or [""])[0]
    commands.say(PROG, f"preparing {args.name} into "
                 f"{args.data_dir or '~/tensorflow_datasets'} failed: "
                 f"{type(e).__name__}: {first}")
    return EXIT_FAILED
  terminal.say(f"{PROG}: {args.name} is prepared in {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
