"""`python -m dist_keras.launch`: the local launcher (cli.py)."""
import sys

from dist_keras.launch import cli

if __name__ == "__main__":
  sys.exit(cli.main())
