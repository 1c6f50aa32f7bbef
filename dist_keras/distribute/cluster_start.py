"""A cluster's strategy where TensorFlow started before it.

MultiWorkerMirroredStrategy configures TensorFlow's collective ops as it
is made, which TensorFlow takes only before its runtime starts (TF 2.21:
`RuntimeError: Collective ops must be configured at program startup`). A
script that uses TensorFlow before fit (keras.io's FeatureSpace script
calls adapt() at import) died there with a traceback on one worker while
its peers waited for it and were told to rerun. `refuse_started` says why
in one line before anything waits, on every worker (each runs that
script); TensorFlow has no coordination service yet to carry one worker's
line to the others (reports.py). The line names the call that works:
`dist_keras.prepare_runtime()` at the top of the script makes the
strategy there (strategies.prepare), and fit reuses it.
"""
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from dist_keras.distribute import tfconfig
from dist_keras.errors import UserError


def started() -> bool:
  """Whether TensorFlow's runtime has started in this process: the check
  TensorFlow's own configure_collective_ops makes (TF 2.21)."""
  return getattr(context.context(), "_context_handle", None) is not None


def refuse_started(cluster: tfconfig.ClusterSpec | None) -> None:
  """UserError where TF_CONFIG names a cluster, whose strategy configures
  collective ops, and TensorFlow has started already."""
  if cluster is None or not started():
    return
  raise UserError(
      f"TF_CONFIG names a cluster of {cluster.num_workers} task(s) but "
      "TensorFlow started before fit (a layer, tensor or adapt() at "
      "import?), and MultiWorkerMirroredStrategy must configure its "
      "collectives at program start; call dist_keras.prepare_runtime() at "
      "the top of the script, before anything uses TensorFlow, or make "
      "tf.distribute.MultiWorkerMirroredStrategy() there and pass it as "
      "strategy=.")


def refuse_other_options(made: tuple, asked: tuple, names: tuple) -> None:
  """UserError where this process's cluster strategy was made with the
  options `made` (runtime.collective, ...: `names`) and a run asks for
  `asked`: a second one cannot start (collectives are configured once)."""
  differ = [f"runtime.{name}={new!r} (made with {old!r})"
            for name, old, new in zip(names, made, asked) if old != new]
  if differ:
    raise UserError(
        f"{', '.join(differ)}: this process's MultiWorkerMirroredStrategy "
        "was made already (by dist_keras.prepare_runtime() or an earlier "
        "fit) and a second cannot start; drop the key, or make "
        "tf.distribute.MultiWorkerMirroredStrategy(communication_options="
        "...) first thing and pass it as strategy=.")
