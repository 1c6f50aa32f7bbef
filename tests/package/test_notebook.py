"""notebooks/colab_tpu.ipynb runs top to bottom on this TPU-less CPU host.

Executed with nbclient in a fresh kernel (its own process: the notebook
splits the CPU and starts TensorFlow itself), with DIST_KERAS_NOTEBOOK_TEST=1
(no install, few steps) and the explicit CPU choice (DEVICE="cpu"); and once
with the default DEVICE="tpu" on a fake Colab, where it must stop before
training. Its TensorBoard cell really starts a TensorBoard server (on
localhost); the test stops it.
"""
import importlib.util
import os
import signal
import sys

import pytest

import helpers

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")
from IPython.core import inputtransformer2  # pylint: disable=g-import-not-at-top
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


@pytest.mark.parametrize("host,cause,fix", [
    ({}, "no TPU was found (runtime.tpu='local' is this host's TPU, and it "
     "shows none", "; Runtime > Change runtime type > TPU (v5e-1 or v6e-1), "
     "then Runtime > Run all; "),
    # A TPU runtime whose install failed: the fix is the install, not the
    # runtime type it already has.
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, "a TPU is here "
     "(TPU_ACCELERATOR_TYPE is set) but this TensorFlow has no libtpu to "
     "start it", "; pip install "),
], ids=["no_tpu", "tpu_without_libtpu"])
def test_on_colab_without_a_tpu_it_stops_before_training(
    tmp_path, monkeypatch, host, cause, fix):
  """The default DEVICE="tpu" on a (fake) Colab where no TPU starts: one
  line, what was tried and the notebook's own switches (the runtime type or
  the install, DEVICE), no silent CPU run."""
  if host and importlib.util.find_spec("libtpu"):
    pytest.skip("this Python has libtpu: it would try the TPU")
  workdir = str(tmp_path / "run")
  _environment(monkeypatch, workdir, COLAB_RELEASE_TAG="fake-for-test", **host)
  monkeypatch.delenv("DIST_KERAS_NOTEBOOK_DEVICE", raising=False)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  with pytest.raises(nbclient.exceptions.CellExecutionError) as error:
    _client(nb).execute()
  assert error.value.ename == "SystemExit"
  message = error.value.evalue
  assert "\n" not in message, message
  assert message.startswith(f"Stopped before training: {cause}"), message
  assert fix in message, message
  assert message.endswith('; or set DEVICE = "cpu" in the first cell to '
                          "train on this machine's CPUs/GPUs."), message
  # Said once, and not the command line's switch, which it does not set.
  assert message.count("Change runtime type") <= 1
  assert "runtime.strategy" not in message, message
  assert not os.path.exists(workdir)


class _Shell:
  """get_ipython() for the install cell: records `!` commands and `%`
  magics instead of running them."""

  def __init__(self):
    self.ran = []

  def system(self, command):
    self.ran.append(command)

  def run_line_magic(self, name, line):
    self.ran.append(f"%{name} {line}")


@pytest.mark.parametrize("device,install", [
    ("tpu", 'pip install -q -e ".[tpu]"'),
    # A CPU/GPU runtime keeps its own TensorFlow: tensorflow-tpu over it
    # makes `import tensorflow` hang without a TPU (its libtpu retries the
    # metadata server).
    ("cpu", "pip install -q -e ."),
])
def test_on_colab_the_install_cell_installs_the_extra_device_needs(
    device, install):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  [cell] = [c for c in nb.cells if c.cell_type == "code"
            and "pip install" in c.source]
  shell = _Shell()
  code = inputtransformer2.TransformerManager().transform_cell(cell.source)
  first_cell = {"IN_COLAB": True, "TEST": False, "DEVICE": device,
                "REPO_URL": "https://github.com/me/dist_keras"}
  exec(code, {"get_ipython": lambda: shell, **first_cell})  # pylint: disable=exec-used
  assert shell.ran == [
      "git clone -q {REPO_URL} /content/dist_keras",
      "%cd /content/dist_keras", install]
