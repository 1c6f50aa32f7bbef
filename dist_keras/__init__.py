"""dist_keras: data-parallel training of Keras 3 models with tf.distribute."""
import importlib.util as _importlib_util
import sys as _sys

__version__ = "0.1.0"

# TensorFlow is an extra (a Colab/TPU image brings its own build), so its
# absence is an installation choice, not a bug: say which extra fixes it.
if _importlib_util.find_spec("tensorflow") is None:
  _MESSAGE = (
      "dist_keras needs TensorFlow, which is installed through an extra: "
      "pip install 'dist-keras[cpu]' (CPU), 'dist-keras[cuda]' (NVIDIA GPUs) "
      "or 'dist-keras[tpu]' (Cloud TPU VMs); Colab images already have it.")
  print(_MESSAGE, file=_sys.stderr)
  raise ImportError(_MESSAGE)
