"""dist_keras: data-parallel training of Keras 3 models with tf.distribute.

  import dist_keras
  result = dist_keras.fit(model_fn, dataset_fn, workdir="runs/mine")

`import dist_keras` does not import TensorFlow (the command line sets up its
environment first); `dist_keras.fit` and `dist_keras.FitResult` import it
when first used.
"""
import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys

from dist_keras.errors import UserError

__version__ = "0.1.0"
__all__ = ["fit", "FitResult", "UserError"]

# TensorFlow is an extra (a Colab/TPU image brings its own build), so its
# absence is an installation choice, not a bug: say which extra fixes it.
if _importlib_util.find_spec("tensorflow") is None:
  _MESSAGE = (
      "dist_keras needs TensorFlow, which is installed through an extra: "
      "pip install 'dist-keras[cpu]' (CPU), 'dist-keras[cuda]' (NVIDIA GPUs) "
      "or 'dist-keras[tpu]' (Cloud TPU VMs); Colab images already have it.")
  print(_MESSAGE, file=_sys.stderr)
  raise ImportError(_MESSAGE)


def __getattr__(name):
  if name in ("fit", "FitResult"):
    return getattr(_importlib.import_module("dist_keras.api"), name)
  raise AttributeError(f"module 'dist_keras' has no attribute {name!r}")
