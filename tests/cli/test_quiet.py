"""quiet.py: TensorFlow's start-up lines filtered from fd 2 (the command
line), and tf.distribute's INFO lines kept out of a `dist_keras.fit` run
where a notebook kernel's root logger would show them, unless the user set
TensorFlow's logger level."""
import logging
import os
import sys

import pytest

import dist_keras
import user_task
from dist_keras import quiet


def test_startup_lines_are_filtered_and_the_rest_passes(capfd):
  with quiet.startup_lines_filtered():
    os.write(2, b"I0000 cpu_feature_guard.cc:227] This TensorFlow binary\n"
                b"a real error line\n"
                b"To enable the following instructions: AVX2 FMA\n")
  assert capfd.readouterr().err == "a real error line\n"


@pytest.mark.parametrize("level,inside", [
    (logging.NOTSET, logging.WARNING),  # A script's default.
    (logging.INFO, logging.WARNING),  # TensorFlow's own in a kernel.
    (logging.DEBUG, logging.DEBUG),  # The user asked for more: kept.
    (logging.ERROR, logging.ERROR)])
def test_tf_info_lines_are_off_in_the_block_where_the_level_is_default(
    level, inside):
  logger = logging.getLogger("tensorflow")
  previous = logger.level
  try:
    logger.setLevel(level)
    with quiet.tf_info_lines_off():
      assert logger.level == inside
    assert logger.level == level
  finally:
    logger.setLevel(previous)


def test_a_fit_in_a_kernel_like_logger_shows_no_tf_distribute_info(
    tmp_path, mirrored, caplog):
  """TensorFlow sets its logger to INFO in a kernel (and caplog's handler
  takes INFO here): the run's collectives would log a line each."""
  caplog.set_level(logging.INFO, logger="tensorflow")
  config = {"train.global_batch_size": user_task.GLOBAL_BATCH,
            "train.steps": 4, "eval.every": 0, "log.calibration_steps": 0,
            "log.progress": False}
  dist_keras.fit(user_task.model_fn, user_task.dataset_fn,
                 workdir=str(tmp_path), config=config, strategy=mirrored)
  tf_info = [r.getMessage() for r in caplog.records
             if r.name == "tensorflow" and r.levelno < logging.WARNING]
  assert not tf_info, tf_info[:3]
  assert logging.getLogger("tensorflow").level == logging.INFO


def test_a_line_is_one_write_with_its_end(monkeypatch):
  """A TensorFlow thread's log line (fd 2) landed between an error line
  and its newline when print wrote them apart: one write holds both."""
  from dist_keras import terminal  # pylint: disable=g-import-not-at-top
  writes = []

  class Stream:
    def write(self, text):
      if text:
        writes.append(text)

    def flush(self):
      pass

  monkeypatch.setattr(sys, "stderr", Stream())
  terminal.error("worker:1 stopped the job: refused.")
  assert writes == ["dist_keras: error: worker:1 stopped the job: refused.\n"]
