"""`dist_keras.fit` in a Jupyter kernel, as a Colab or notebook user runs it:
no tf.distribute INFO lines in the cell's output (TensorFlow sets its
logger to INFO in an interactive session), and the kernel's interrupt (the
stop button: SIGINT) checkpoints the step and raises Interrupted; the next
cell's fit resumes there."""
import os
import queue
import re
import sys

import pytest

import helpers

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

FIT = """
import dist_keras
config = {{"train.steps": {steps}, "train.log_every": 5, "eval.every": 0,
          "train.checkpoint_every": 100000, "log.calibration_steps": 0,
          "log.peak_tflops": 1.0, "data.seq_len": 12, "model.units": 16}}
dist_keras.fit("sequence_classifier", "longmem", workdir={workdir!r},
               config=config)
"""


@pytest.fixture
def kernel():
  manager = jupyter_client.KernelManager(kernel_name="python3")
  manager.kernel_spec.argv[0] = sys.executable  # This virtualenv's Python.
  manager.start_kernel(env=dict(os.environ, PYTHONPATH=helpers.REPO,
                                TF_CPP_MIN_LOG_LEVEL="2"))
  client = manager.client()
  client.start_channels()
  client.wait_for_ready(timeout=120)
  yield manager, client
  client.stop_channels()
  manager.shutdown_kernel(now=True)


def _run(manager, client, code, interrupt_at=None):
  """(the cell's printed text, its error (ename, evalue) or None); sends
  the kernel an interrupt once a printed line matches `interrupt_at`."""
  msg_id, text, error = client.execute(code), [], None
  while True:
    try:
      msg = client.get_iopub_msg(timeout=240)
    except queue.Empty:
      pytest.fail("the kernel went quiet: " + "".join(text)[-2000:])
    if msg["parent_header"].get("msg_id") != msg_id:
      continue
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
      text.append(content["text"])
      if interrupt_at and re.search(interrupt_at, content["text"]):
        manager.interrupt_kernel()
        interrupt_at = None
    elif kind == "error":
      error = (content["ename"], content["evalue"])
    elif kind == "status" and content["execution_state"] == "idle":
      return "".join(text), error


def test_a_kernel_interrupt_checkpoints_and_the_next_cell_resumes(
    tmp_path, kernel):
  workdir = str(tmp_path / "run")
  text, error = _run(*kernel, FIT.format(steps=100000, workdir=workdir),
                     interrupt_at=r"^step +\d+/100000")
  assert "INFO:tensorflow" not in text, text[-2000:]
  assert "Ctrl-C: stopping after this step with a checkpoint" in text
  assert error and error[0] == "Interrupted", (error, text[-2000:])
  stopped = re.match(r"stopped by Ctrl-C \(SIGINT\) after step (\d+); "
                     r"checkpoint ckpt-\1 saved", error[1])
  assert stopped, error[1]
  step = int(stopped[1])
  text, error = _run(*kernel, FIT.format(steps=step + 3, workdir=workdir))
  assert error is None, (error, text[-2000:])
  assert f"resumed from ckpt-{step} at step {step}" in text
  assert f"done: {step + 3} steps" in text
