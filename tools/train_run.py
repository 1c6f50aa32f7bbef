"""One `python -m dist_keras.train` run in a subprocess, for the benchmark
tools, and the files the tools read and write around it.

Calibration and progress lines are off: the tools time whole runs, and the
post-training calibration would add seconds that are not training.
"""
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(config: str, workdir: str, overrides) -> tuple[dict, float]:
  """Trains `config` (a path under the repo) into `workdir`.

  Returns:
    (summary.json as a dict, wall seconds of the whole command).

  Raises:
    SystemExit: the run failed; carries the end of its stderr.
  """
  command = [sys.executable, "-m", "dist_keras.train", f"--config={config}",
             f"--workdir={workdir}", "--config.log.progress=False",
             "--config.log.calibration_steps=0", *overrides]
  start = time.monotonic()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          check=False)
  seconds = time.monotonic() - start
  if result.returncode:
    raise SystemExit(f"{' '.join(overrides)} failed:\n"
                     f"{result.stderr[-2000:]}")
  return read_summary(workdir), seconds


def read_summary(workdir: str) -> dict:
  """The run's summary.json. Raises ValueError saying what is wrong."""
  path = os.path.join(workdir, "summary.json")
  try:
    with open(path) as f:
      return json.load(f)
  except OSError as e:
    raise ValueError(f"no readable {path} ({e.strerror})") from None
  except json.JSONDecodeError:
    raise ValueError(f"{path} is not valid JSON") from None


def write_atomically(path: str, write) -> None:
  """Calls write(tmp_path), then renames: `path` is whole or absent."""
  tmp = path + ".tmp"
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_json(path: str, data: dict) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      f.write(json.dumps(data, indent=2) + "\n")
  write_atomically(path, write)
