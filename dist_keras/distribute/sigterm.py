"""SIGTERM after TensorFlow's collective runtime starts.

Creating a MultiWorkerMirroredStrategy installs TensorFlow's own SIGTERM
handler in C++ (tsl's SigtermNotifier, meant for PreemptionCheckpointHandler),
which only records the signal. Python does not see it (`signal.getsignal`
still says SIG_DFL), so a worker that had started ignored SIGTERM until
training installed dist_keras' own handler (training/preemption.py): one
building its model, or one whose peers crashed, stayed until SIGKILL.

TensorFlow's own wait for the peers cannot be helped from Python: it
installs its handler inside the call that waits, and that call holds the
interpreter (no Python thread runs until it returns; checked on TF 2.21).
So a worker waits for its peers before that call (rendezvous.py), where
SIGTERM and Ctrl-C stop it; TensorFlow's wait is then short.
"""
import signal

from dist_keras import signals


def kept():
  """Puts back, after the block, the SIGTERM handler Python had set before
  it (the default action unless the program set its own), over the one
  TensorFlow installed in C++ while the block ran."""
  return signals.kept((signal.SIGTERM,))
