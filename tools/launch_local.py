"""The local launcher, run from a checkout: dist_keras.launch, shipped in
the package (`python -m dist_keras.launch`, or the `dist-keras-launch`
console script where dist_keras is installed).

  python tools/launch_local.py --num_workers=2 -- \\
      python -m dist_keras.train --workdir=/tmp/run

Same flags, output and exit codes (dist_keras/launch/cli.py); its own lines
begin `launch_local: `, as they did before it moved into the package: the
chaos tool, the tests and the pages quoting them read that prefix.
"""
import sys

import common  # noqa: F401  The checkout on sys.path, for dist_keras.
from dist_keras.launch import cli

PROG = "launch_local"

if __name__ == "__main__":
  sys.exit(cli.main(prog=PROG))
