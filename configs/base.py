"""Base config: every key dist_keras reads, with its default.

Experiment configs import this and override a few keys. The returned
ConfigDict is locked (an unknown key is an error) and type-safe (assigning a
string to an int key is an error), including `--config.KEY=VALUE` overrides.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the locked base config."""
  c = ml_collections.ConfigDict()

  c.runtime = ml_collections.ConfigDict()
  # auto | mirrored | one_device | multi_worker_mirrored | tpu
  c.runtime.strategy = "auto"
  # Logical CPU devices to split the host CPU into when there is no GPU.
  c.runtime.num_cpu_devices = 2
  c.runtime.tpu = "local"  # TPU name or grpc:// address; 'local' on TPU VMs.
  # multi_worker_mirrored: tf.distribute.experimental.CommunicationOptions.
  c.runtime.collective = "auto"  # auto | ring | nccl (GPUs)
  c.runtime.bytes_per_pack = 0  # Gradient pack size for all-reduce; 0: one.
  c.runtime.timeout_seconds = 0.0  # Per collective; 0: no timeout.
  c.runtime.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.name = "longmem"  # longmem | shapes | tfds:NAME
  c.data.data_dir = ""  # TFDS: local path or gs://; "" = ~/tensorflow_datasets.
  # TFDS: download and prepare a dataset missing from data_dir (needs the
  # network); otherwise fail at once saying how to prepare it.
  c.data.download = False
  c.data.train_size = 16384  # Examples in the (repeated) train split.
  c.data.eval_size = 2048  # Examples in the held-out eval split.
  # longmem: the label is the first token mod num_classes; the rest is noise.
  c.data.seq_len = 50
  c.data.vocab_size = 16  # imdb_reviews: hash buckets (0 = padding).
  c.data.num_classes = 4  # Built-in data only; TFDS reads it from the data.
  # shapes: images of num_classes shapes (<= 4), image_size pixels square.
  c.data.image_size = 32  # TFDS: side to resize to; 0 keeps the native size.
  c.data.noise = 0.1
  c.data.shuffle_buffer = 4096
  # One tf.data pipeline per replica instead of per worker: a one-process run
  # then reads exactly what N one-replica workers read (equivalence checks).
  c.data.pipeline_per_replica = False

  c.model = ml_collections.ConfigDict()
  # sequence_classifier | cnn | char_lm | resnet50
  c.model.name = "sequence_classifier"
  c.model.cell = "lstm"  # lstm | gru | simple_rnn (sequence_classifier)
  c.model.embed_dim = 32
  c.model.units = 64
  c.model.num_layers = 1
  # Chrono gate-bias initialisation (Tallec & Ollivier 2018) for LSTM/GRU.
  c.model.chrono_init = True
  c.model.filters = (32, 64)  # cnn: one conv block per entry.
  c.model.dense_units = 64  # cnn: hidden dense layer.

  c.train = ml_collections.ConfigDict()
  c.train.optimizer = "adam"  # sgd | adam | adamw | rmsprop
  c.train.learning_rate = 3e-3
  # Batch-size rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"):
  # learning_rate is meant for a global batch of base_batch_size; the rate
  # used is learning_rate * k for k = global_batch_size / base_batch_size
  # ("linear", the paper's rule for SGD), * sqrt(k) ("sqrt", often the better
  # fit for Adam, whose update size depends less on gradient noise), or
  # unchanged ("none").
  c.train.lr_scaling = "none"  # none | linear | sqrt
  c.train.base_batch_size = 256
  # Gradual warmup: ramp linearly from learning_rate (unscaled) to the scaled
  # rate over this many steps, then stay there (0: start at the scaled rate).
  c.train.warmup_steps = 0
  # Clip the global gradient norm (after the all-reduce); 0 disables.
  c.train.global_clipnorm = 1.0
  c.train.global_batch_size = 256
  c.train.steps = 800
  c.train.log_every = 25
  c.train.checkpoint_every = 100
  # Plain train steps per tf.function call (host round trips dominate on
  # TPUs); logged/timed/checkpoint/eval steps still run where they fall.
  c.train.steps_per_loop = 1
  # float32 | bfloat16 (Keras mixed_bfloat16: bfloat16 compute, float32
  # variables; TPUs' native type).
  c.train.precision = "float32"
  c.train.max_checkpoints = 3

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 100  # 0: only at the end.
  c.eval.steps = 0  # 0: the whole eval split.

  c.log = ml_collections.ConfigDict()
  c.log.tensorboard = True
  c.log.progress = True  # One line per train.log_every steps on the chief.
  # Split logged steps into input wait / compute / straggler / all-reduce.
  c.log.sync_timing = True
  # "START,STOP": TF profiler trace of those train steps into the workdir
  # (TensorBoard's Profile tab; tools/profile_collectives.py). START >= 2.
  c.log.profile_steps = ""
  # After training: all-reduce microbenchmark + alpha-beta fit, and the same
  # step timed with no communication (0 steps: skip both).
  c.log.calibration_steps = 20

  c.lock()
  return c
