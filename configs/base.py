"""Base config: every key dist_keras reads, with its default.

Experiment configs import this and override a few keys. The returned
ConfigDict is locked (an unknown key is an error) and type-safe (assigning a
string to an int key is an error), including `--config.KEY=VALUE` overrides.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the locked base config: one section per concern."""
  c = ml_collections.ConfigDict()
  c.runtime = _runtime()
  c.data = _data()
  c.model = _model()
  c.train = _train()
  c.eval = _eval()
  c.log = _log()
  c.lock()
  return c


def _runtime() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  # auto | mirrored | one_device | multi_worker_mirrored | tpu
  s.strategy = "auto"
  # Logical CPU devices to split the host CPU into when there is no GPU.
  s.num_cpu_devices = 2
  s.tpu = "local"  # TPU name or grpc:// address; 'local' on TPU VMs.
  # multi_worker_mirrored: tf.distribute.experimental.CommunicationOptions.
  s.collective = "auto"  # auto | ring | nccl (GPUs)
  s.bytes_per_pack = 0  # Gradient pack size for all-reduce; 0: one.
  s.timeout_seconds = 0.0  # Per collective; 0: no timeout.
  # multi_worker_mirrored: seconds a worker waits for every other task of
  # TF_CONFIG to start listening before it gives up (exit 200, naming them);
  # 0: no limit. Long enough for a pod's scheduling and image pull.
  s.peer_start_timeout_seconds = 600.0
  # float32 | bfloat16 | float16: the gradients' dtype in the all-reduce
  # only (16 bits: half the bytes, summed in 16 bits; see dist_keras/training/allreduce.py).
  s.allreduce_dtype = "float32"
  s.seed = 0
  return s


def _data() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  # longmem | shapes | tfds:NAME | synthetic (one random batch, repeated:
  # compute + sync without an input pipeline; accuracy is meaningless).
  s.name = "longmem"
  s.data_dir = ""  # TFDS: local path or gs://; "" = ~/tensorflow_datasets.
  # TFDS: download and prepare a dataset missing from data_dir (needs the
  # network); otherwise fail at once saying how to prepare it.
  s.download = False
  s.train_size = 16384  # Examples in the (repeated) train split.
  s.eval_size = 2048  # Examples in the held-out eval split.
  # The shape of the config's data. The built-in data and data.name=synthetic
  # (which builds the same model as the real data) take them from here; TFDS
  # reads channels and num_classes (and tiny_shakespeare's 256 byte values)
  # from the data and warns when the config declares other values.
  # longmem: the label is the first token mod num_classes; the rest is noise.
  s.seq_len = 50
  s.vocab_size = 16  # imdb_reviews: hash buckets (0 = padding).
  s.num_classes = 4
  # shapes: images of num_classes shapes (<= 4), image_size pixels square.
  s.image_size = 32  # TFDS: side to resize to; 0 keeps the native size.
  s.channels = 1  # Image channels: 1 grey, 3 RGB.
  s.noise = 0.1
  s.shuffle_buffer = 4096
  # One tf.data pipeline per replica instead of per worker: a one-process run
  # then reads exactly what N one-replica workers read (equivalence checks).
  s.pipeline_per_replica = False
  # tf.data options (tools/grid.py --mock_tfds measures them): prefetch batches
  # (AUTOTUNE) while the replicas compute; a private thread pool of this
  # many threads for the pipeline (0: TensorFlow's shared pool).
  s.prefetch = True
  s.threads = 0
  return s


def _model() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  # sequence_classifier | cnn | char_lm | resnet50
  s.name = "sequence_classifier"
  s.cell = "lstm"  # lstm | gru | simple_rnn (sequence_classifier)
  s.embed_dim = 32
  s.units = 64
  s.num_layers = 1
  # Chrono gate-bias initialisation (Tallec & Ollivier 2018) for LSTM/GRU.
  s.chrono_init = True
  s.filters = (32, 64)  # cnn: one conv block per entry.
  s.dense_units = 64  # cnn: hidden dense layer.
  return s


def _train() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.optimizer = "adam"  # sgd | adam | adamw | rmsprop
  s.learning_rate = 3e-3
  # sgd, rmsprop: momentum (0.9 with sgd is Goyal et al.'s setting below).
  s.momentum = 0.0
  # Batch-size rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"):
  # learning_rate is meant for a global batch of base_batch_size; the rate
  # used is learning_rate * k for k = global_batch_size / base_batch_size
  # ("linear", the paper's rule for SGD), * sqrt(k) ("sqrt", often the better
  # fit for Adam, whose update size depends less on gradient noise), or
  # unchanged ("none").
  s.lr_scaling = "none"  # none | linear | sqrt
  s.base_batch_size = 256
  # Gradual warmup: ramp linearly from learning_rate (unscaled) to the scaled
  # rate over this many steps, then stay there (0: start at the scaled rate).
  s.warmup_steps = 0
  # Clip the global gradient norm (after the all-reduce); 0 disables.
  s.global_clipnorm = 1.0
  s.global_batch_size = 256
  s.steps = 800
  s.log_every = 25
  s.checkpoint_every = 100
  # Plain train steps per tf.function call (an in-graph loop: no host round
  # trip between them, which TPUs need above all); logged/timed/checkpoint/
  # eval steps still run where they fall. 0: automatic, as many as fit in
  # about a second (one step per call until the first log line has measured
  # the step), up to the next step the host must see; under multi-worker,
  # up to that step (every worker must group steps alike).
  s.steps_per_loop = 0
  # float32 | bfloat16 | float16: Keras mixed precision (16-bit compute,
  # float32 variables). bfloat16 (TPUs', recent GPUs' and CPUs' native type)
  # has float32's range; float16 (older GPUs' tensor cores) needs dynamic
  # loss scaling, which it gets (keras LossScaleOptimizer).
  s.precision = "float32"
  # XLA-compile each replica's forward and backward pass; on one device the
  # whole untimed step, update included (as Keras' fit(jit_compile=True));
  # under Mirrored/multi-worker the all-reduce and update stay in the graph.
  s.jit_compile = False
  s.max_checkpoints = 3
  # A non-finite loss: reload the last checkpoint and go on past the batches
  # that produced it, up to this many times (0: stop at once, exit 3).
  s.divergence_retries = 0
  # Your Keras callbacks: "PKG.MODULE:FN" naming a function that returns a
  # list of keras.callbacks.Callback ("": none). An epoch is one eval
  # interval (eval.every steps); docs/own_models.md#callbacks.
  s.callbacks = ""
  # Keras' fit(class_weight=...): class i's weight at index i (a class past
  # the end: refused at its batch), each train batch's sample weights as
  # fit makes them from its labels; the eval is not weighed. (): none.
  # dist_keras.fit(class_weight={0: 1.0, 1: 50.0}) sets it.
  s.class_weight = ()
  return s


def _eval() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.every = 100  # 0: only at the end.
  s.steps = 0  # 0: the whole eval split.
  return s


def _log() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.tensorboard = True
  # Every line of the run on the chief's stdout: the start, one per
  # train.log_every steps, evals, calibration, MFU and `done:`. False
  # prints none of them (warnings and errors still go to stderr).
  s.progress = True
  # Also a line (step, s/step, ETA) whenever this many seconds pass without
  # one: a slow model's train.log_every steps can take minutes. 0: never.
  s.progress_seconds = 30.0
  # Split logged steps into input wait / compute / straggler / all-reduce.
  s.sync_timing = True
  # "START,STOP": TF profiler trace of those train steps into the workdir
  # (TensorBoard's Profile tab; tools/profile_collectives.py). START >= 2.
  s.profile_steps = ""
  # After training: all-reduce microbenchmark + alpha-beta fit, and the same
  # step timed with no communication (0 steps: skip both).
  s.calibration_steps = 20
  # Peak TFLOP/s per device (per worker process on CPU) that perf/mfu
  # divides by; 0: automatic (a table of known GPUs/TPUs at
  # train.precision, else a timed matmul: dist_keras/measure/mfu.py).
  s.peak_tflops = 0.0
  # Also log exp(loss) as `perplexity` / `eval/perplexity`: for language
  # models, whose loss is the mean cross-entropy per token.
  s.perplexity = False
  return s
