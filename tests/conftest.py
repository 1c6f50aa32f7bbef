"""Test set-up: 2 logical CPU devices for every in-process test, its graphs
run without TensorFlow's graph optimizer, short MFU peak readings, and the
order CI hands test files to its workers.

The split must happen before TensorFlow initialises, hence at import time.
In-process tests keep to ONE replica count (2): two MirroredStrategy objects
over different device counts in one process break collectives ("joining a
group with size 4, but that group has size 2"). Other counts run in
subprocesses (tests/helpers.py).
"""
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# helpers.py and the users' modules (user_task, parity_task) live here; the
# tools import their sibling modules (common, scaling_report) as they do
# when run as scripts; the subprocess scripts are imported by tests too.
for folder in (TESTS, REPO, os.path.join(REPO, "tools"),
               os.path.join(TESTS, "scripts")):
  sys.path.insert(0, folder)

from dist_keras.distribute import cpus  # pylint: disable=g-import-not-at-top

cpus.split_cpu(2)

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from dist_keras.measure import mfu  # pylint: disable=g-import-not-at-top,wrong-import-position

# A measured MFU peak is timed for MATMUL_SECONDS at a run's start (once a
# process) and again at its end: 0.5 s of a busy matmul, ~0.8 CPU-s, an
# eighth of a tiny in-process run. The tests check what a run does with
# its readings (kept, the higher one, MFU from it), not how close they
# are to the machine's peak: 50 ms still times 4 or more matmuls.
mfu.MATMUL_SECONDS = 0.05

# Seconds each test file took in the last recorded run (`pytest
# --record-durations ...` writes it): CI hands the longest files out first.
DURATIONS = os.path.join(TESTS, "durations.json")


@pytest.fixture(scope="session")
def mirrored():
  """MirroredStrategy over the 2 logical CPU devices (one per session)."""
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def no_network(monkeypatch):
  """Any connection attempt or TFDS download fails the test at once."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def refuse(*args, **kwargs):
    raise AssertionError("network used")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", refuse)


def pytest_sessionstart(session):
  """The tests' subprocesses get a temporary folder under pytest's basetemp
  (TMPDIR): TensorFlow's autograph writes a module per converted function
  there and deletes them at a normal exit only, so each run a test kills
  left ~10 in /tmp (~150 an hour of testing); pytest prunes old basetemps.
  Set here, before the test files are imported: some copy os.environ."""
  factory = session.config._tmp_path_factory  # pylint: disable=protected-access
  temp = factory.getbasetemp() / "tmp"
  temp.mkdir(exist_ok=True)
  os.environ["TMPDIR"] = str(temp)


def pytest_addoption(parser):
  parser.addoption("--record-durations", action="store_true",
                   help=f"write each file's seconds to {DURATIONS}")
  parser.addoption("--graph-optimizer", action="store_true",
                   help="in-process runs keep TensorFlow's graph optimizer")


def pytest_configure(config):
  """In-process runs run their graphs without TensorFlow's graph optimizer
  (grappler) unless --graph-optimizer: optimizing a step's graph at its
  first call is ~30% of a tiny run's CPU, and a graph run as written is
  the stricter test (a cast the optimizer had removed failed here first:
  measure/stamps.py). Runs in subprocesses (the command line, workers, fit
  parity, resume, the examples and the wheel) keep TensorFlow's default,
  as users run."""
  if not config.getoption("--graph-optimizer"):
    tf.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": True})


def pytest_xdist_auto_num_workers(config):  # pylint: disable=unused-argument
  """`-n auto`: one worker more than the cores this process may use. Many
  tests wait on their subprocesses (multi-worker peers, heartbeats, kill
  and restart), and a spare worker fills those waits: on 2 cores the CPU
  was busy 85% of a 2-worker run and 91% of a 3-worker one (2026-12-01)."""
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count() or 1)  # macOS has no affinity call.
  return cores + 1


def _file(nodeid: str) -> str:
  """'tests/training/test_loop.py::test_x' -> 'training/test_loop.py'."""
  return nodeid.split("::")[0].removeprefix("tests/")


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Longest files first (`--dist loadfile --no-loadscope-reorder` hands
  files out in this order: a long file handed out late runs alone at the
  end); a file with no recorded time counts as long. Stable otherwise."""
  try:
    with open(DURATIONS, encoding="utf-8") as f:
      seconds = json.load(f)
  except FileNotFoundError:
    seconds = {}
  longest = max(seconds.values(), default=0.0)
  items.sort(key=lambda item: -seconds.get(_file(item.nodeid), longest))


_RECORDED = {}


def pytest_runtest_logreport(report):
  key = _file(report.nodeid)
  _RECORDED[key] = _RECORDED.get(key, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  if not session.config.getoption("--record-durations") or hasattr(
      session.config, "workerinput"):  # The controller writes, once.
    return
  with open(DURATIONS, "w", encoding="utf-8") as f:
    json.dump({k: round(v, 1) for k, v in sorted(_RECORDED.items())}, f,
              indent=1)
    f.write("\n")
