"""notebooks/colab_tpu.ipynb runs top to bottom on this TPU-less CPU host.

Executed with nbclient in a fresh kernel (its own process: the notebook
splits the CPU and starts TensorFlow itself), with DIST_KERAS_NOTEBOOK_TEST=1
(no install, few steps) and the explicit CPU choice (DEVICE="cpu"); and once
with the default DEVICE="tpu" on a fake Colab, where it must stop before
training. Its TensorBoard cell really starts a TensorBoard server (on
localhost); the test stops it.
"""
import os
import signal
import sys

import pytest

import helpers

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")
from tensorboard import manager  # pylint: disable=g-import-not-at-top

NOTEBOOK = os.path.join(helpers.REPO, "notebooks", "colab_tpu.ipynb")
STEPS = 30


def _outputs(cell) -> str:
  """A code cell's printed text and plain-text results."""
  text = []
  for out in cell.get("outputs", []):
    if out.get("output_type") == "stream":
      text.append(out["text"])
    elif "data" in out:
      text.append(out["data"].get("text/plain", ""))
  return "".join(text)


def _html(cell) -> str:
  return "".join(out.get("data", {}).get("text/html", "")
                 for out in cell.get("outputs", []))


def _stop_tensorboards(logdir: str) -> None:
  """Stops the TensorBoard servers the notebook started on `logdir`
  (shutting the kernel down usually has: they are its children)."""
  for info in manager.get_all():
    if os.path.abspath(info.logdir) == os.path.abspath(logdir):
      try:
        os.kill(info.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass


def _environment(monkeypatch, workdir: str, **env) -> None:
  monkeypatch.setenv("DIST_KERAS_NOTEBOOK_TEST", "1")
  monkeypatch.setenv("DIST_KERAS_NOTEBOOK_STEPS", str(STEPS))
  monkeypatch.setenv("DIST_KERAS_NOTEBOOK_WORKDIR", workdir)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
  # The kernel finds the checkout, and %tensorboard this Python's
  # `tensorboard` script.
  monkeypatch.setenv("PYTHONPATH", helpers.REPO)
  monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep
                     + os.environ.get("PATH", ""))
  for key, value in env.items():
    monkeypatch.setenv(key, value)


def _client(nb):
  # A cell's limit is generous: alone the training cell takes ~30 s, but under
  # CI load the end of fit can also wait out tf.data's autotune thread (up
  # to 60 s, docs/outputs.md), and 120 s was once passed that way.
  return nbclient.NotebookClient(
      nb, timeout=300, kernel_name="python3",
      resources={"metadata": {"path": helpers.REPO}})


@pytest.fixture
def executed(tmp_path, monkeypatch):
  """The notebook after a run on the CPU, as nbformat cells."""
  workdir = str(tmp_path / "run")
  _environment(monkeypatch, workdir, DIST_KERAS_NOTEBOOK_DEVICE="cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  try:
    _client(nb).execute()
  finally:
    _stop_tensorboards(workdir)
  return [c for c in nb.cells if c.cell_type == "code"], workdir


def test_notebook_runs_and_reports_eval_accuracy(executed):
  cells, workdir = executed
  text = [_outputs(c) for c in cells]
  assert "install skipped" in text[1]
  assert "device cpu" in text[0]
  assert "MirroredStrategy with 2 replica(s)" in text[2]
  assert "No TPU" not in text[2]
  assert f"step {STEPS}/{STEPS}" in text[3]
  # A user's own model through dist_keras.fit (random guessing: MAE 1.6).
  assert f"done: {STEPS} steps, eval mae " in text[4]
  mae = float(text[4].split("eval MAE ")[1].split()[0])
  assert 0 < mae < 1.6, text[4]
  assert os.path.exists(os.path.join(workdir + "_own", "model.keras"))
  assert "<iframe" in _html(cells[5]) and "Failed" not in text[5], text[5]
  assert f"MirroredStrategy x2 on CPU: {STEPS} steps, eval accuracy " in (
      text[6])
  assert os.path.exists(os.path.join(workdir, "summary.json"))


def test_on_colab_without_a_tpu_it_stops_before_training(tmp_path,
                                                        monkeypatch):
  """The default DEVICE="tpu" on a (fake) Colab with no TPU: one message
  saying how to switch the runtime, no silent CPU run."""
  workdir = str(tmp_path / "run")
  _environment(monkeypatch, workdir, COLAB_RELEASE_TAG="fake-for-test")
  monkeypatch.delenv("DIST_KERAS_NOTEBOOK_DEVICE", raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  with pytest.raises(nbclient.exceptions.CellExecutionError) as error:
    _client(nb).execute()
  message = str(error.value)
  assert "No TPU: runtime.strategy='tpu' but no TPU was found" in message
  assert "Runtime > Change runtime type > TPU (v5e-1 or v6e-1)" in message
  assert 'set DEVICE = "cpu" in the first cell' in message
  assert not os.path.exists(workdir)
