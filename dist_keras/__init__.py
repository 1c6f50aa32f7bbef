"""dist_keras: data-parallel training of Keras 3 models with tf.distribute.

  import dist_keras
  result = dist_keras.fit(model_fn, dataset_fn, workdir="runs/mine")

`import dist_keras` does not import TensorFlow (the command line sets up its
environment first); `dist_keras.fit` and `dist_keras.FitResult` import it
when first used.
"""
import contextlib as _contextlib
import sys as _sys

from dist_keras import installation as _installation
from dist_keras.errors import UserError

__version__ = "0.1.0"
__all__ = ["fit", "FitResult", "UserError", "prepare_runtime"]

from dist_keras import from_checkout

from_checkout.install()

from dist_keras import quiet, validate  # noqa: E402 (configs found first)
from dist_keras.configs import refuse_unread as _refuse_unread
from dist_keras.configs import resolve as _resolve_config
from dist_keras.configs import set_in as _set_in
from dist_keras.contract import fit_args as _fit_args
from dist_keras.contract import imports


@_fit_args.refusing_keras_args
def fit(model_fn, dataset_fn, *, workdir: str, config=None, strategy=None,
        callbacks=None):
  """Trains `model_fn`'s model on `dataset_fn`'s data, data-parallel.

  Args:
    model_fn: `() -> keras.Model`, compiled by you (optimizer, loss,
      metrics), called inside the strategy's scope; or a name: a built-in
      model (e.g. "sequence_classifier") or "PKG.MODULE:FN".
    dataset_fn: `(split, input_context) -> tf.data.Dataset` of that input
      pipeline's per-replica batches (x, y) or (x, y, sample_weight): "train"
      repeated, batches of `input_context.get_per_replica_batch_size(B)` (B:
      train.global_batch_size); "eval" finite, or None for no eval (Keras'
      fit without validation_data); or a built-in's name, or "PKG.MODULE:FN".
    workdir: folder for checkpoints, TensorBoard events, config.json,
      summary.json and model.keras; a rerun with the same folder resumes.
    config: None (configs/base.py's defaults), a config (ConfigDict, e.g.
      `dist_keras.configs.load("lstm_longmem")`), or a dict of overrides of
      the defaults, {"train.steps": 500, ...}.
    strategy: None (the config's runtime.strategy: "auto" picks TPU, a
      TF_CONFIG cluster, or every local GPU / runtime.num_cpu_devices CPU
      devices), a runtime.strategy name, or a tf.distribute.Strategy.
    callbacks: a list of keras.callbacks.Callback, run as `model.fit` runs
      them; an epoch is one eval interval (eval.every steps). On the
      command line: train.callbacks=PKG.MODULE:FN returning the list.
    class_weight= (Keras' fit's {class: weight}) sets train.class_weight.

  Returns:
    dist_keras.FitResult(model, summary, workdir, history).

  Raises:
    dist_keras.UserError: a bad setting, model or dataset, a key set in
      `config` that its built-in model or data does not read, or a Keras fit
      argument (epochs=, ...): one line naming it and the fix, before
      anything is written.
    dist_keras.errors.Diverged, PeerLost, NoIntactCheckpoint: errors.py;
      Preempted (a SystemExit, code 143): SIGTERM, the step checkpointed.
    dist_keras.errors.NoSpace, NoWriteAccess (OSErrors): the disk under
      the workdir filled up, or stopped taking writes (read-only, its
      permissions), at start or mid-run; one line naming the file and the
      last checkpoint kept there, from which a call once fixed resumes.
    dist_keras.errors.WorkdirRemoved: the workdir was removed or moved
      away mid-run; the run stopped after saving a checkpoint in it anew.
    dist_keras.errors.Interrupted (a KeyboardInterrupt): Ctrl-C; the step
      it stopped at was checkpointed (a second Ctrl-C stops at once).
  """
  _installation.check_tensorflow_installed(ImportError)
  with _told_to_peers(strategy):  # The door: every argument resolved once.
    given, config = config, _resolve_config(config)
    functions = _recorded(given, config, model_fn, dataset_fn)
    if isinstance(strategy, str):
      config.runtime.strategy = strategy
    _refuse_ignored(config, given, strategy)
    validate.config(config)
  if not _is_strategy(strategy):  # Chosen, and set up, before TF starts.
    from dist_keras.distribute import tfconfig  # pylint: disable=g-import-not-at-top
    strategy = tfconfig.chosen(config.runtime.strategy, tfconfig.from_env())
    _prepare(config, _set_in(given, config), strategy)
  from dist_keras import api  # pylint: disable=g-import-not-at-top
  with quiet.tf_info_lines_off(), validate.workdir_spelled(True):  # workdir=.
    return api.run(api.Job(config, workdir, strategy, functions, callbacks))


def _is_strategy(strategy) -> bool:
  return strategy is not None and not isinstance(strategy, str)


@_contextlib.contextmanager
def _told_to_peers(strategy):
  """The door's refusals, told to the other workers when fit is given a
  strategy object: a cluster's coordination service runs already, so
  this worker joins it first and reports one of its own there
  (distribute/reports.py), as one in the run; its peers waited in the
  run's first collective until they lost it, and were restarted."""
  if not _is_strategy(strategy):
    yield
    return
  from dist_keras.distribute import reports, tfconfig  # pylint: disable=g-import-not-at-top
  cluster = tfconfig.from_env()
  reports.joined(cluster)
  try:
    yield
  except UserError as e:
    reports.report(e, cluster)
    raise


# What a strategy object decides in place of these keys: they only choose
# and build a strategy (distribute/tfconfig.chosen, strategies.make).
_STRATEGY_DECIDES = ("runtime.strategy", "runtime.num_cpu_devices",
                     "runtime.tpu", "runtime.collective",
                     "runtime.timeout_seconds",
                     "runtime.peer_start_timeout_seconds")


def _refuse_ignored(config, given, strategy) -> None:
  """UserError for a key set in `given` (fit's config) that would be
  ignored: one the named built-in model or data does not read, or one of a
  dict that a strategy object makes moot. (A whole config may be the one
  the strategy was built from: the Colab notebook's is.)"""
  user_set = _set_in(given, config)
  _refuse_unread(config, user_set)
  if not _is_strategy(strategy) or not isinstance(given, dict):
    return
  for key in _STRATEGY_DECIDES:
    if key in user_set:
      raise UserError(
          f"{user_set[key]}: strategy= is a {type(strategy).__name__}, which"
          f" decides the devices and collectives, so {key} would be ignored;"
          " drop the key, or pass strategy=None or a name and let the config"
          " build the strategy.")


def _recorded(given, config, model_fn, dataset_fn) -> tuple:
  """(model_fn, dataset_fn), each a function or None (a name, recorded in
  config), once no name in `given` (fit's config) says otherwise."""
  _fit_args.refuse_two_names(_set_in(given, config), config,
                             {"model_fn": model_fn, "dataset_fn": dataset_fn})
  return (_record_name(config.model, model_fn, "model_fn"),
          _record_name(config.data, dataset_fn, "dataset_fn"))


def _prepare(config, user_set, chosen: str) -> None:
  """fit's part of prepare_runtime: the TPU's environment; and a
  runtime.num_cpu_devices set in fit's config (`user_set`), where
  TensorFlow started before fit with fewer devices, refused as a split
  asked for (cpus.split_cpu), even at the default count: not set, auto
  trains on the devices TensorFlow has (cpus.auto_devices)."""
  _prepare_tpu(config.runtime.strategy, config.runtime.tpu)
  if (chosen != "mirrored" or "runtime.num_cpu_devices" not in user_set
      or "tensorflow" not in _sys.modules):  # (Not imported: not started.)
    return
  from dist_keras.distribute import cpus  # pylint: disable=g-import-not-at-top
  cpus.asked(config.runtime.num_cpu_devices)


def _record_name(section, fn, what: str):
  """For a function: records its import path as section.name (config.json
  says what trained) and returns it; for a name: sets section.name.
  `what` is the argument ("model_fn", "dataset_fn")."""
  if callable(fn):
    section.name = imports.name_of(fn)
    return fn
  if not isinstance(fn, str):
    raise UserError(f"{what} is a {_kind(fn)}, not a function or a name; "
                    f"pass {_WANTED[what]}; see help(dist_keras.fit).")
  section.name = fn
  return None


_WANTED = {
    "model_fn": "a function that builds and compiles the model",
    # Keras' fit(x=dataset) habit: dist_keras needs one per input pipeline.
    "dataset_fn": "a function of (split, input_context) that returns that "
                  "split's tf.data.Dataset for that input pipeline (wrap "
                  "your dataset in one: dist_keras calls it once per input "
                  "pipeline)",
}


def _kind(value) -> str:
  """'tf.data.Dataset (_BatchDataset)', or the value's type. (TensorFlow
  is not imported for it: a Dataset's owner imported it.)"""
  tf = _sys.modules.get("tensorflow")
  data = getattr(tf, "data", None)
  if data is not None and isinstance(value, data.Dataset):
    return f"tf.data.Dataset ({type(value).__name__})"
  return type(value).__name__


def prepare_runtime(strategy: str = "auto", tpu: str = "local",
                    verbose: bool = False,
                    num_cpu_devices: int | None = None) -> dict:
  """Sets up TensorFlow's devices before TensorFlow starts.

  On a TPU v5e, v5p or v6e (Colab's TPU runtimes, Cloud TPU VMs) TensorFlow
  reaches the TPU only through the PJRT runtime, chosen by environment
  variables read when TensorFlow is imported: this sets them (never over a
  value you set) when `strategy` ("auto" or "tpu", as runtime.strategy)
  wants this host's TPU and the libtpu package is installed. The command
  line and `fit` do the same; a notebook calls it in its first cell, before
  anything imports TensorFlow.

  `num_cpu_devices=N` also splits the host CPU into N logical devices (as
  runtime.num_cpu_devices, which `fit` asks for when it starts): for a
  script that uses TensorFlow before `fit` (a layer, a tensor or `adapt()`
  at import), which fixes the device list, call it first thing. It imports
  TensorFlow.

  Where TF_CONFIG names a cluster that `strategy` trains on, it makes
  MultiWorkerMirroredStrategy now, waiting for the other workers (it
  configures TensorFlow's collectives, which only program start can), and
  `fit` trains under it: a script that uses TensorFlow before `fit` calls
  it first thing on every worker.

  Returns:
    {variable: value} of what was set.

  Raises:
    UserError: TensorFlow started before it with fewer CPU devices, or
      at all under a TF_CONFIG cluster.
  """
  set_now = _prepare_tpu(strategy, tpu, verbose)
  if num_cpu_devices is not None:
    validate.num_cpu_devices(num_cpu_devices)
    from dist_keras.distribute import cpus  # pylint: disable=g-import-not-at-top
    cpus.split_cpu(num_cpu_devices)
  from dist_keras.distribute import tfconfig  # pylint: disable=g-import-not-at-top
  if tfconfig.from_env() is not None:  # (No TensorFlow import before.)
    from dist_keras.distribute import strategies  # pylint: disable=g-import-not-at-top
    strategies.prepare(strategy)
  return set_now


def _prepare_tpu(strategy: str, tpu: str, verbose: bool = False) -> dict:
  from dist_keras.distribute import tpu_env  # pylint: disable=g-import-not-at-top
  return tpu_env.prepare_and_report(strategy, tpu, verbose)


def __getattr__(name):
  if name == "FitResult":  # It names keras.Model: TensorFlow starts here.
    _installation.check_tensorflow_installed(ImportError)
    from dist_keras import api  # pylint: disable=g-import-not-at-top
    return api.FitResult
  raise AttributeError(f"module 'dist_keras' has no attribute {name!r}")
