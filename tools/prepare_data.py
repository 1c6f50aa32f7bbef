"""Prepares a TFDS dataset, run from a checkout: dist_keras.prepare_data,
shipped in the package (`python -m dist_keras.prepare_data`), with the same
arguments, lines and exit status.

  python tools/prepare_data.py mnist --data_dir ~/tensorflow_datasets
"""
import sys

import common  # noqa: F401  The checkout on sys.path, for dist_keras.
from dist_keras.prepare_data import main

if __name__ == "__main__":
  sys.exit(main())
