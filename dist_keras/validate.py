"""Every check of a config's values, in one place, before TensorFlow starts.

The command line runs `config()` before it imports TensorFlow (a typo costs
a fraction of a second, not a TensorFlow start-up); `dist_keras.fit` runs it
for Python callers. The rest of the package trusts the values. What can only
be checked against something else is checked where that is known, once: a
built-in model or dataset against the data's shape (registry.py),
TF_CONFIG against the strategy (distribute/tfconfig.choose), a user's model and
data against the contract (contract/checks.py).

No TensorFlow import here, and the choices' names live here (the built-in
models' and datasets' in catalog.py): the modules that act on them map
names to objects.
"""
import contextlib
import contextvars
import math
import os

from dist_keras.catalog import DATASETS, MODELS, TFDS_PREFIX
from dist_keras.errors import UserError

# Every other choice a config names, declared once, here (TF-free:
# validation runs before TensorFlow starts); the modules that act on a name
# read it from these tables.
# model.cell -> its keras.layers class.
CELLS = {"lstm": "LSTM", "gru": "GRU", "simple_rnn": "SimpleRNN"}
STRATEGIES = ("auto", "mirrored", "one_device", "multi_worker_mirrored", "tpu")
# runtime.collective -> tf.distribute.experimental.CommunicationImplementation.
COLLECTIVES = ("auto", "ring", "nccl")
ALLREDUCE_DTYPES = ("float32", "bfloat16", "float16")
# train.precision -> Keras' dtype policy.
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16",
              "float16": "mixed_float16"}
# train.lr_scaling -> the factor for a global batch `ratio` times
# train.base_batch_size (training/lr.py).
LR_SCALINGS = {"none": lambda ratio: 1.0, "linear": lambda ratio: ratio,
               "sqrt": math.sqrt}
# The built-in models' optimizers: Keras' own names (keras.optimizers.get).
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
# The optimizers train.momentum applies to (Adam-style optimizers have their
# own first-moment decay, beta_1, instead).
MOMENTUM_OPTIMIZERS = ("sgd", "rmsprop")
# TensorFlow's and NumPy's seeds are 32-bit unsigned.
SEED_LIMIT = 2**32


def check_choice(key: str, value, choices) -> None:
  """Raises UserError unless `value` of config key `key` is in `choices`."""
  if value not in choices:
    raise UserError(f"{key}={value!r} is not one of {', '.join(choices)}; "
                    "pick one of those.")


def is_import_path(name: str) -> bool:
  """Whether `name` is meant as a user's PKG.MODULE:FN (it has a ':'; the
  contract's imports.py loads it)."""
  return ":" in name and not name.startswith(TFDS_PREFIX)


def model_name(name: str) -> None:
  """A built-in model's name, or a user's PKG.MODULE:FN (loaded later)."""
  if name not in MODELS and not is_import_path(name):
    raise UserError(f"model.name={name!r} is not one of {', '.join(MODELS)}"
                    ", or PKG.MODULE:FN naming your own model_fn; pick one of"
                    " those.")


def data_name(name: str) -> None:
  """A built-in dataset's name, tfds:NAME, or a user's PKG.MODULE:FN."""
  if (name not in DATASETS and not name.startswith(TFDS_PREFIX)
      and not is_import_path(name)):
    raise UserError(f"data.name={name!r} is not one of {', '.join(DATASETS)}"
                    ", tfds:NAME (e.g. tfds:mnist), or PKG.MODULE:FN naming "
                    "your own dataset_fn; pick one of those.")


def config(c) -> None:
  """Raises UserError, one line naming the value and the fix, for the first
  bad value of config `c`."""
  model_name(c.model.name)
  model = MODELS.get(c.model.name)
  if model and "cell" in model.reads:  # Only a model that reads it.
    check_choice("model.cell", c.model.cell, CELLS)
  data_name(c.data.name)
  if c.train.callbacks and not is_import_path(c.train.callbacks):
    raise UserError(f"train.callbacks={c.train.callbacks!r} is not "
                    "PKG.MODULE:FN naming a function that returns your list "
                    "of keras callbacks; name one, or leave it empty.")
  _runtime(c.runtime)
  _data(c.data)
  _model(c.model)
  _train(c.train)
  _devices_for_batch(c.runtime.num_cpu_devices, c.train.global_batch_size)
  for key in ("every", "steps"):
    _at_least(f"eval.{key}", getattr(c.eval, key), 0)
  _at_least("data.threads", c.data.threads, 0,
            "0: TensorFlow's shared pool")
  profile_steps(c.log.profile_steps)
  _at_least("log.peak_tflops", c.log.peak_tflops, 0,
            "0: the table of known accelerators, or a measured matmul on CPU")
  _at_least("log.progress_seconds", c.log.progress_seconds, 0,
            "0: progress lines at train.log_every steps only")
  _at_least("log.calibration_steps", c.log.calibration_steps, 0,
            "0: no all-reduce calibration after training")


# Whether the run's lines name its workdir as dist_keras.fit's argument
# (`workdir='runs/a'`) or as the command line's flag (`--workdir=runs/a`),
# as a config key is config['KEY'] or --config.KEY: dist_keras.fit sets it.
_AS_FIT_ARGUMENT = contextvars.ContextVar("workdir_as_fit_argument",
                                          default=False)


@contextlib.contextmanager
def workdir_spelled(as_fit_argument: bool):
  """The run's lines name its workdir as fit's argument, or the flag."""
  token = _AS_FIT_ARGUMENT.set(as_fit_argument)
  try:
    yield
  finally:
    _AS_FIT_ARGUMENT.reset(token)


def named_workdir(path) -> str:
  """`--workdir=runs/a` on the command line, `workdir='runs/a'` in fit."""
  return (f"workdir={path!r}" if _AS_FIT_ARGUMENT.get()
          else f"--workdir={path or ''}")


def workdir_option() -> str:
  """What to pass another of: "--workdir", or fit's "workdir"."""
  return "workdir" if _AS_FIT_ARGUMENT.get() else "--workdir"


def workdir_named(path) -> None:
  """Raises UserError for an empty workdir (`--workdir=$WORKDIR` with the
  variable unset): it would train into the current folder, or a new
  runs/<timestamp> on every run, so that no rerun after a preemption would
  resume. (api.build checks one passed to fit here too.)"""
  if not path:
    raise UserError(
        f"{named_workdir(path)} names no folder (an unset variable?); "
        "pass the run's folder (a rerun with the same one resumes)" + (
            "." if _AS_FIT_ARGUMENT.get() else
            ", or leave --workdir out for a new runs/<timestamp>."))


def workdir(path: str) -> None:
  """Raises UserError if the local folder `path` cannot be made or written:
  it, or the nearest part of it that exists, is a file or is not writable.
  Creates nothing (a bad value found later must leave nothing behind); the
  chief makes the folder, and checks a gs:// one, when it first writes
  (training/run_files.py)."""
  if "://" in path:
    return
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  why = ("is a file" if not os.path.isdir(existing) else
         "is not writable" if not os.access(existing, os.W_OK | os.X_OK)
         else "")
  if why:
    raise UserError(f"{named_workdir(path)} is not writable ({existing} "
                    f"{why}); pass a folder you can write to.")


def _runtime(runtime) -> None:
  check_choice("runtime.strategy", runtime.strategy, STRATEGIES)
  num_cpu_devices(runtime.num_cpu_devices)
  check_choice("runtime.collective", runtime.collective, COLLECTIVES)
  _at_least("runtime.bytes_per_pack", runtime.bytes_per_pack, 0,
            "0: one pack")
  _at_least("runtime.timeout_seconds", runtime.timeout_seconds, 0,
            "0: no timeout")
  _at_least("runtime.peer_start_timeout_seconds",
            runtime.peer_start_timeout_seconds, 0, "0: no limit")
  check_choice("runtime.allreduce_dtype", runtime.allreduce_dtype,
               ALLREDUCE_DTYPES)
  if not 0 <= runtime.seed < SEED_LIMIT:
    raise UserError(f"runtime.seed={runtime.seed} is outside "
                    f"0..{SEED_LIMIT - 1} (TensorFlow's seed range); pick a "
                    "seed in it.")


def num_cpu_devices(n) -> None:
  """runtime.num_cpu_devices, or prepare_runtime's, is a count >= 1."""
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise UserError(f"runtime.num_cpu_devices={n!r} must be >= 1.")


def _devices_for_batch(num_cpu_devices: int, global_batch_size: int) -> None:
  """More CPU devices than examples per step can never train (and
  TensorFlow took minutes to make thousands before the batch's split over
  them was checked, in distribute/pipelines.py, once the strategy is known)."""
  if num_cpu_devices > global_batch_size:
    raise UserError(f"runtime.num_cpu_devices={num_cpu_devices} is more than "
                    f"train.global_batch_size={global_batch_size} (each "
                    "replica needs at least one example); use at most "
                    f"{global_batch_size}.")


def _data(data) -> None:
  """The built-in data's sizes (a user's dataset_fn reads none of them;
  registry.py refuses them then)."""
  for key in ("train_size", "eval_size", "seq_len", "channels"):
    _at_least(f"data.{key}", getattr(data, key), 1)
  for key in ("vocab_size", "num_classes"):
    _at_least(f"data.{key}", getattr(data, key), 2)
  _at_least("data.image_size", data.image_size, 0, "0: TFDS images' own size")
  _at_least("data.noise", data.noise, 0)
  _at_least("data.shuffle_buffer", data.shuffle_buffer, 1,
            "1: no shuffling")


def _model(model) -> None:
  """The built-in models' sizes."""
  for key in ("embed_dim", "units", "num_layers", "dense_units"):
    _at_least(f"model.{key}", getattr(model, key), 1)
  filters = tuple(model.filters)
  if not filters or not all(isinstance(f, int) and not isinstance(f, bool)
                            and f >= 1 for f in filters):
    raise UserError(f"model.filters={filters} must be whole numbers >= 1, "
                    "one per conv block (e.g. (32, 64)).")


def _train(train) -> None:
  for key in ("steps", "global_batch_size", "log_every", "checkpoint_every",
              "max_checkpoints"):
    if getattr(train, key) < 1:
      raise UserError(f"train.{key}={getattr(train, key)} must be >= 1.")
  _at_least("train.steps_per_loop", train.steps_per_loop, 0, "0: automatic")
  _at_least("train.divergence_retries", train.divergence_retries, 0,
            "0: stop at the first non-finite loss")
  check_choice("train.precision", train.precision, PRECISIONS)
  lr_rule(train)
  _optimizer(train)


def _optimizer(train) -> None:
  """The built-in models' optimizer settings (a user's model brings its
  own; registry.py refuses these keys then)."""
  check_choice("train.optimizer", train.optimizer, OPTIMIZERS)
  rate = train.learning_rate
  if not (rate > 0 and math.isfinite(rate)):  # nan fails both.
    raise UserError(f"train.learning_rate={rate} must be > 0"
                    + ("." if math.isfinite(rate) else " and finite."))
  if not 0.0 <= train.momentum < 1.0:
    raise UserError(f"train.momentum={train.momentum} must be in [0, 1) "
                    "(0.9 is the usual SGD momentum).")
  if train.momentum and train.optimizer not in MOMENTUM_OPTIMIZERS:
    raise UserError(f"train.momentum={train.momentum} does nothing with "
                    f"train.optimizer={train.optimizer!r} (its beta_1 "
                    "plays that part); use it with "
                    f"{' or '.join(MOMENTUM_OPTIMIZERS)}, or set momentum=0.")
  _at_least("train.global_clipnorm", train.global_clipnorm, 0,
            "0: no clipping")


def lr_rule(train) -> None:
  """train.lr_scaling, base_batch_size and warmup_steps (training/lr.py)."""
  check_choice("train.lr_scaling", train.lr_scaling, LR_SCALINGS)
  if train.base_batch_size < 1:
    raise UserError(f"train.base_batch_size={train.base_batch_size} must "
                    "be >= 1 (the global batch the learning rate is for).")
  _at_least("train.warmup_steps", train.warmup_steps, 0)
  if train.warmup_steps > train.steps:
    raise UserError(f"train.warmup_steps={train.warmup_steps} is more than "
                    f"train.steps={train.steps}; use at most {train.steps}.")
  if train.warmup_steps and train.lr_scaling == "none":
    raise UserError(f"train.warmup_steps={train.warmup_steps} does nothing "
                    "with train.lr_scaling='none' (warmup ramps from the "
                    "compiled rate to the scaled rate); set lr_scaling to "
                    "linear or sqrt, or warmup_steps=0.")


def profile_steps(spec: str) -> tuple[int, int]:
  """log.profile_steps 'START,STOP' -> (START, STOP); '' -> (0, 0)."""
  if not spec:
    return 0, 0
  try:
    start, stop = (int(x) for x in spec.split(","))
  except ValueError:
    start = stop = -1
  if not 2 <= start <= stop:
    raise UserError(f"log.profile_steps={spec!r} must be 'START,STOP' with "
                    "2 <= START <= STOP (step 1 traces the function).")
  return start, stop


def _at_least(key: str, value, low, meaning: str = "") -> None:
  """UserError unless `value` >= `low`; a float key's nan or inf too."""
  finite = not isinstance(value, float) or math.isfinite(value)
  if not finite or value < low:
    raise UserError(f"{key}={value} must be "
                    + ("a finite number " if not finite else "") + f">= {low}"
                    + (f" ({meaning})." if meaning else "."))
