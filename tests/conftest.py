"""Test set-up: 2 logical CPU devices for every in-process test.

The split must happen before TensorFlow initialises, hence at import time.
In-process tests keep to ONE replica count (2): two MirroredStrategy objects
over different device counts in one process break collectives ("joining a
group with size 4, but that group has size 2"). Other counts run in
subprocesses (tests/helpers.py).
"""
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# The tools import their sibling modules (common, scaling_report) as they do
# when run as scripts from tools/.
sys.path.insert(0, os.path.join(REPO, "tools"))
# The subprocess scripts (tests/scripts/) are imported by tests too.
sys.path.insert(0, os.path.join(REPO, "tests", "scripts"))

from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top

strategies.split_cpu(2)


import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position


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


# Every file that took more than ~40 s of a worker's time in CI's command
# (measured 2026-12-01, -m "not slow", 3 workers), longest first: the
# README's command runs the suite as `-n auto --dist loadfile
# --no-loadscope-reorder` (one file per worker at a time, in this order), and
# a long file handed out late runs alone at the end (test_loop.py, the
# longest at ~300 s, was handed out mid-way, with ~400 s of other files left
# for the other two workers: an estimated ~100 s alone).
LONGEST_FIRST = ("test_fit_parity.py", "test_loop.py", "test_multi_worker.py", "test_xla.py",
                 "test_resume.py", "test_sync_scaling.py", "test_cli.py",
                 "test_user_models.py", "test_equivalence.py", "test_tfds.py",
                 "test_wheel.py", "test_synthetic_data.py", "test_notebook.py",
                 "test_speed_options.py", "test_shipped_configs.py",
                 "test_callbacks.py")


def pytest_xdist_auto_num_workers(config):  # pylint: disable=unused-argument
  """`-n auto`: one worker more than the cores this process may use. Many
  tests wait on their subprocesses (multi-worker peers, heartbeats, kill
  and restart), and a spare worker fills those waits: on 2 cores the CPU
  was busy 85% of a 2-worker run and 91% of a 3-worker one (2026-12-01)."""
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count() or 1)  # macOS has no affinity call.
  return cores + 1


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable.
