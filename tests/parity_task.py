"""Models a Keras user trains with `model.fit`, each using one feature fit
honours: the model's own train_step, gradient accumulation, EMA, clipping,
a LossScaleOptimizer, a schedule, weight-decay exclusions, two outputs, a
GAN's two optimizers (also held in a list and a sub-model's dict), an
Embedding's and a sparse input's sparse gradients; and callbacks factories.
Nothing here imports dist_keras: tests train these with Keras' fit and with
dist_keras alike.
"""
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 48  # Splits evenly over 1, 2, 3 and 4 replicas.
FEATURES = 6
# 200 eval examples: the last batch is partial at every replica count.
SIZES = {"train": 512, "eval": 200}


def short_run(steps: int) -> dict:
  """dist_keras.fit's config for `steps` quiet steps of these batches: no
  events, no progress lines, no calibration, a peak given (not timed)."""
  return {"train.steps": steps, "train.global_batch_size": GLOBAL_BATCH,
          "train.log_every": 3, "eval.every": 0, "log.tensorboard": False,
          "log.progress": False, "log.calibration_steps": 0,
          "log.peak_tflops": 1.0}


def _examples(split: str):
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  n = SIZES[split]
  x = rng.normal(size=(n, FEATURES)).astype("float32")
  y = x @ np.linspace(-1.0, 1.0, FEATURES) + 0.1 * rng.normal(size=n)
  return x, y.astype("float32")[:, None]


def dataset_fn(split, input_context):
  """(x, y) regression batches. Batched, then sharded by input pipeline:
  pipeline i of n reads per-replica batches i, i + n, ..., so a global
  step reads the same examples at any replica and worker count (one
  device's batch k is the replicas' k-th batches together)."""
  x, y = _examples(split)
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    ds = ds.shuffle(SIZES["train"], seed=0).repeat().batch(
        batch, drop_remainder=True)
  else:
    ds = ds.batch(batch)
  return ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)


def train_only_dataset_fn(split, input_context):
  """dataset_fn's train split, and no eval split (None), as Keras' fit
  without validation_data."""
  return None if split == "eval" else dataset_fn(split, input_context)


def two_output_dataset_fn(split, input_context):
  """Two inputs, two named targets: a class (y > 0) and the value."""
  return dataset_fn(split, input_context).map(
      lambda x, y: ((x, 2.0 * x), {"cls": tf.cast(y > 0, tf.float32),
                                   "reg": y}))


def images_dataset_fn(split, input_context):
  """x only (a GAN's real samples)."""
  return dataset_fn(split, input_context).map(lambda x, y: x)


VOCAB, TOKENS = 12, 5  # 240 lookups of 12 tokens a global batch.


def _tokens(split: str):
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  return rng.integers(0, VOCAB, (SIZES[split], TOKENS)).astype("int32")


def tokens_dataset_fn(split, input_context):
  """(token ids, class) batches, every token repeated within each batch;
  batched and sharded as dataset_fn's."""
  x = _tokens(split)
  return _batched(tf.data.Dataset.from_tensor_slices((x, x[:, 0] % 3)),
                  split, input_context)


def bags_dataset_fn(split, input_context):
  """The tokens as bags of words (tf.SparseTensor x float32[b, VOCAB]: a
  token's count) and the same class: every column present in each
  replica's batch."""
  x = _tokens(split)
  counts = np.stack([np.bincount(row, minlength=VOCAB) for row in x])
  return _batched(tf.data.Dataset.from_tensor_slices(
      (tf.sparse.from_dense(counts.astype("float32")), x[:, 0] % 3)),
                  split, input_context)


def _batched(ds, split, input_context):
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  if split == "train":
    ds = ds.repeat().batch(batch, drop_remainder=True)
  else:
    ds = ds.batch(batch)
  return ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)


def embedding_adam():
  """An Embedding under Adam: its gradient is a tf.IndexedSlices, one slice
  per looked-up token, which Adam squares slice by slice."""
  return _embedding(keras.optimizers.Adam(0.01))


class TokenAndPosition(keras.layers.Layer):
  """keras.io's TokenAndPositionEmbedding: a token Embedding plus a
  position Embedding of ops.arange(length), whose lookup has no batch
  dimension (one slice per position, summed over the batch)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.token = keras.layers.Embedding(VOCAB, 4)
    self.position = keras.layers.Embedding(TOKENS, 4)

  def call(self, x):  # pylint: disable=arguments-differ
    length = keras.ops.shape(x)[-1]
    return self.token(x) + self.position(keras.ops.arange(0, length, 1))


def positions_adam():
  """keras.io's transformer, tiny, under Adam: token and position
  Embeddings, attention, a layer norm. Adam squares each position's slice:
  gathered from 2 replicas, a position came twice (0.0126 off one device
  after 12 steps of the full-size one)."""
  tokens = keras.Input((TOKENS,), dtype="int32")
  x = TokenAndPosition()(tokens)
  x = keras.layers.LayerNormalization()(
      x + keras.layers.MultiHeadAttention(
          num_heads=1, key_dim=4, use_bias=False)(x, x))
  model = keras.Model(tokens, keras.layers.Dense(3)(
      keras.layers.Flatten()(x)))
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def sparse_adam():
  """A bag of words (a sparse input) into Dense layers under Adam: Keras
  multiplies it by the kernel with tf.nn.embedding_lookup_sparse, whose
  gradient is a slice per distinct column of the batch, summed over its
  examples, which Adam squares slice by slice."""
  return _bags(keras.Model)


def sparse_own_step():
  """sparse_adam with Keras' guide's own train_step."""
  return _bags(GuideStep)


class GuideStep(keras.Model):
  def train_step(self, data):
    return guide_train_step(self, data)[0]


def _bags(model_class):
  inputs = keras.Input((VOCAB,), sparse=True)
  hidden = keras.layers.Dense(4, activation="tanh")(inputs)
  model = model_class(inputs, keras.layers.Dense(3)(hidden))
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def embedding_global_clipnorm():
  """embedding_adam under a global-norm clip that scales every step (the
  gradients' norms are 0.05-0.2): Keras' clip hands Adam the dense table,
  which 2 replicas all-reduce instead of gathering the slices."""
  return _embedding(keras.optimizers.Adam(0.01, global_clipnorm=0.01))


def embedding_clipnorm():
  """embedding_adam clipped per variable (the Embedding's slices' norm is
  0.04-0.05): Keras clips the slices and hands them to Adam as slices."""
  return _embedding(keras.optimizers.Adam(0.01, clipnorm=0.01))


# Rows of embeddings_mixed's large Embedding: its table (48 KB) sends more
# than a replica's slices (1-3 KB at 2-4 replicas), the small one's less.
LARGE_VOCAB = 3000


def embeddings_mixed():
  """Two Embeddings of the tokens under one global-norm clip, added: on 2+
  replicas the small one's table is all-reduced, the large one's slices
  gathered (each the path of fewer bytes), and both clipped by one norm."""
  tokens = keras.Input((TOKENS,), dtype="int32")
  added = keras.layers.Add()([keras.layers.Embedding(VOCAB, 4)(tokens),
                              keras.layers.Embedding(LARGE_VOCAB, 4)(tokens)])
  model = keras.Model(tokens, keras.layers.Dense(3)(
      keras.layers.GlobalAveragePooling1D()(added)))
  model.compile(optimizer=keras.optimizers.Adam(0.01, global_clipnorm=0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def _embedding(optimizer):
  model = keras.Sequential([
      keras.Input((TOKENS,), dtype="int32"),
      keras.layers.Embedding(VOCAB, 4),
      keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  return model


def _dense(inputs):
  hidden = keras.layers.Dense(16, activation="tanh")(inputs)
  return keras.layers.Dense(1)(hidden)


def _compiled(optimizer, model_class=keras.Model, **compile_args):
  inputs = keras.Input((FEATURES,))
  model = model_class(inputs, _dense(inputs))
  model.compile(optimizer=optimizer, loss="mse", metrics=["mae"],
                **compile_args)
  return model


class CallWithoutTraining(keras.Model):
  """A call that takes no `training`: fit calls it as `self(x)`, so its
  Dropout runs in inference mode (off)."""

  def __init__(self):
    super().__init__()
    self.hidden = keras.layers.Dense(16, activation="tanh")
    self.dropout = keras.layers.Dropout(0.5)
    self.out = keras.layers.Dense(1)

  def call(self, x):  # pylint: disable=arguments-differ
    return self.out(self.dropout(self.hidden(x)))


def call_without_training():
  model = CallWithoutTraining()
  model.build((None, FEATURES))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


def plain():
  return _compiled(keras.optimizers.SGD(0.05))


def accumulate():
  return _compiled(keras.optimizers.SGD(0.05, gradient_accumulation_steps=3))


def ema():
  return _compiled(keras.optimizers.SGD(0.05, use_ema=True,
                                        ema_momentum=0.9,
                                        ema_overwrite_frequency=5))


def global_clipnorm():
  return _compiled(keras.optimizers.SGD(0.05, global_clipnorm=0.1))


def clipnorm():
  return _compiled(keras.optimizers.SGD(0.05, clipnorm=0.05))


def clipvalue():
  return _compiled(keras.optimizers.SGD(0.05, clipvalue=0.01))


def loss_scale():
  """An explicit LossScaleOptimizer (as mixed_float16 users compile)."""
  return _compiled(keras.optimizers.LossScaleOptimizer(
      keras.optimizers.SGD(0.05), initial_scale=2.0**10))


def schedule():
  return _compiled(keras.optimizers.Adam(
      keras.optimizers.schedules.ExponentialDecay(0.01, 4, 0.5)))


def weight_decay():
  """AdamW with the biases excluded from weight decay."""
  optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)
  optimizer.exclude_from_weight_decay(var_names=["bias"])
  return _compiled(optimizer)


def callbacks_model():
  """Evaluated in one call of 4 steps, like fit's steps_per_execution=4."""
  return _compiled(keras.optimizers.SGD(0.05), steps_per_execution=4)


class Counting(keras.Model):
  """A model with its own train_step (as Keras' guide writes one) and a
  side effect: it counts its calls."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = keras.Variable(0, dtype="int32", trainable=False,
                                name="calls")

  def train_step(self, data):
    self.calls.assign_add(1)
    return guide_train_step(self, data)[0]


def guide_train_step(model, data):
  """Keras' guide's own train_step ("Customizing what happens in fit"):
  (its logs, the batch's predictions)."""
  x, y = data
  with tf.GradientTape() as tape:
    y_pred = model(x, training=True)
    loss = model.compute_loss(y=y, y_pred=y_pred)
  grads = tape.gradient(loss, model.trainable_variables)
  model.optimizer.apply(grads, model.trainable_variables)
  for metric in model.metrics:
    if metric.name == "loss":
      metric.update_state(loss)
    else:
      metric.update_state(y, y_pred)
  return {m.name: m.result() for m in model.metrics}, y_pred


def custom_step():
  return _compiled(keras.optimizers.SGD(0.05, global_clipnorm=0.1),
                   model_class=Counting)


class ScaledLoss(keras.Model):
  """A model that overrides compute_loss (Keras' hook for custom losses):
  the compiled loss plus 0.1 x the mean prediction squared. Keras' own loss
  comes back divided by the replica count under tf.distribute; a term added
  to it must be too, or N replicas would weigh it N times."""

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                   training=True):
    loss = super().compute_loss(x, y, y_pred, sample_weight, training)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss + 0.1 * tf.reduce_mean(tf.square(y_pred)) / replicas


def custom_loss():
  return _compiled(keras.optimizers.SGD(0.05), model_class=ScaledLoss)


class CountingEval(keras.Model):
  """A model with its own test_step: a metric of its own, and a count."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.evals = keras.Variable(0, dtype="int32", trainable=False,
                                name="evals")
    self.max_error = keras.metrics.Mean(name="abs_error_max")

  def test_step(self, data):
    self.evals.assign_add(1)
    x, y = data
    error = tf.abs(self(x, training=False) - y)
    self.max_error.update_state(tf.reduce_max(error))
    return {"abs_error_max": self.max_error.result()}


def custom_test_step():
  return _compiled(keras.optimizers.SGD(0.05), model_class=CountingEval)


def two_output():
  a, b = keras.Input((FEATURES,)), keras.Input((FEATURES,))
  hidden = keras.layers.Dense(16, activation="tanh")(
      keras.layers.Concatenate()([a, b]))
  return _two_heads([a, b], hidden)


def batch_norm():
  """two_output with BatchNormalization and Dropout: a forward pass in
  training mode moves the moving statistics, Dropout's seed and the
  per-output loss trackers, without any update."""
  a, b = keras.Input((FEATURES,)), keras.Input((FEATURES,))
  hidden = keras.layers.Dense(16)(keras.layers.Concatenate()([a, b]))
  hidden = keras.layers.Dropout(0.2)(keras.layers.Activation("tanh")(
      keras.layers.BatchNormalization()(hidden)))
  return _two_heads([a, b], hidden)


def _two_heads(inputs, hidden):
  model = keras.Model(inputs, {
      "cls": keras.layers.Dense(1, activation="sigmoid", name="cls")(hidden),
      "reg": keras.layers.Dense(1, name="reg")(hidden)})
  model.compile(optimizer=keras.optimizers.SGD(0.05),
                loss={"cls": "binary_crossentropy", "reg": "mse"},
                loss_weights={"cls": 1.0, "reg": 0.5},
                metrics={"cls": ["accuracy"], "reg": ["mae"]})
  return model


class Gan(keras.Model):
  """Keras' GAN guide, in small: two networks, two optimizers, a train_step
  of its own, loss trackers as its metrics, no compiled loss."""

  def __init__(self, networks=None, rates=(1e-3, 1e-3)):
    super().__init__()
    self.generator, self.discriminator = networks or _gan_networks()
    self.d_optimizer = keras.optimizers.Adam(rates[0])
    self.g_optimizer = keras.optimizers.Adam(rates[1])
    self.d_loss = keras.metrics.Mean(name="d_loss")
    self.g_loss = keras.metrics.Mean(name="g_loss")
    self.bce = keras.losses.BinaryCrossentropy(
        from_logits=True, reduction="sum")

  @property
  def metrics(self):
    return [self.d_loss, self.g_loss]

  def call(self, z):
    return self.generator(z)

  def train_step(self, real):
    # The losses are sums over the replica's batch divided by the GLOBAL
    # batch, as a custom loop under tf.distribute writes them; the noise is
    # a function of each example, so any replica count draws the same.
    batch = tf.shape(real)[0]
    z = tf.sin(7.0 * real[:, :2])
    d_optimizer, g_optimizer = self.optimizers_of_step()
    with tf.GradientTape() as tape:
      fake = self.generator(z)
      logits = self.discriminator(tf.concat([real, fake], 0))
      labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], 0)
      d_loss = self.bce(labels, logits) / GLOBAL_BATCH
    weights = self.discriminator.trainable_variables
    d_optimizer.apply(tape.gradient(d_loss, weights), weights)
    with tf.GradientTape() as tape:
      g_loss = self.bce(tf.ones((batch, 1)),
                        self.discriminator(self.generator(z))) / GLOBAL_BATCH
    weights = self.generator.trainable_variables
    g_optimizer.apply(tape.gradient(g_loss, weights), weights)
    self.d_loss.update_state(d_loss)
    self.g_loss.update_state(g_loss)
    return {"d_loss": self.d_loss.result(), "g_loss": self.g_loss.result()}

  def optimizers_of_step(self):
    return self.d_optimizer, self.g_optimizer


def _gan_networks():
  return (keras.Sequential([keras.Input((2,)), keras.layers.Dense(FEATURES)]),
          keras.Sequential([keras.Input((FEATURES,)),
                            keras.layers.Dense(8, "tanh"),
                            keras.layers.Dense(1)]))


def gan():
  model = Gan()
  model.build((None, 2))
  model.d_optimizer.build(model.discriminator.trainable_variables)
  model.g_optimizer.build(model.generator.trainable_variables)
  model.compile()
  return model


class GanOfNetworks(Gan):
  """keras.io's form: __init__ takes its networks, no get_config(), so
  Keras cannot save it whole. (Keras' automatic config of a subclassed
  Model sees none of the arguments given: Gan(networks) would be saved as
  Gan(), its defaults.)"""

  def __init__(self, generator, discriminator, rates):
    super().__init__((generator, discriminator), rates)


def gan_of_networks():
  """GanOfNetworks, compiled as keras.io compiles it: compile() gives it
  Keras' default RMSprop(0.001) as the compiled optimizer, which its
  train_step never steps (its own step at 3e-3 and 2e-3)."""
  model = GanOfNetworks(*_gan_networks(), rates=(3e-3, 2e-3))
  model.build((None, 2))
  model.d_optimizer.build(model.discriminator.trainable_variables)
  model.g_optimizer.build(model.generator.trainable_variables)
  model.compile()
  return model


def gan_unbuilt():
  """The same GAN with its optimizers left to build on first use."""
  model = Gan()
  model.build((None, 2))
  model.compile()
  return model


def gan_unflagged():
  """The GAN as keras.io writes it: never built itself (its call takes the
  latent vector, its batches are real samples), every network inside
  built; Keras' fit on one device trains it."""
  model = Gan()
  model.d_optimizer.build(model.discriminator.trainable_variables)
  model.g_optimizer.build(model.generator.trainable_variables)
  model.compile()
  return model


class GanHeld(Gan):
  """The GAN, its optimizers held as a user may hold them: the
  discriminator's in a list, the generator's in a dict on the generator
  (a nested sub-model); Keras tracks neither."""

  def __init__(self):
    super().__init__()
    self.opts = [self.d_optimizer]
    self.generator.opts = {"g": self.g_optimizer}
    del self.d_optimizer, self.g_optimizer

  def optimizers_of_step(self):
    return self.opts[0], self.generator.opts["g"]


def gan_held():
  """GanHeld with its optimizers left to build on first use."""
  model = GanHeld()
  model.build((None, 2))
  model.compile()
  return model


class Vae(keras.Model):
  """keras.io's VAE shape: an encoder and a decoder, a train_step of its
  own, no call() at all (deterministic here: z is the encoder's mean)."""

  def __init__(self):
    super().__init__()
    self.encoder = keras.Sequential([keras.Input((FEATURES,)),
                                     keras.layers.Dense(4, "tanh"),
                                     keras.layers.Dense(2)])
    self.decoder = keras.Sequential([keras.Input((2,)),
                                     keras.layers.Dense(FEATURES)])
    self.total = keras.metrics.Mean(name="loss")

  @property
  def metrics(self):
    return [self.total]

  def train_step(self, data):
    # Sums over the replica's batch divided by the global batch, as a loop
    # under tf.distribute writes them (any replica count trains alike).
    with tf.GradientTape() as tape:
      z = self.encoder(data)
      reconstruction = tf.reduce_sum(tf.square(data - self.decoder(z)))
      total = (reconstruction + 0.5 * tf.reduce_sum(tf.square(z))) / (
          GLOBAL_BATCH)
    weights = self.trainable_weights
    self.optimizer.apply(tape.gradient(total, weights), weights)
    self.total.update_state(total)
    return {"loss": self.total.result()}


def vae():
  model = Vae()
  model.compile(optimizer=keras.optimizers.Adam(1e-2))
  return model


class Endpoint(keras.layers.Layer):
  """keras.io's endpoint layer: adds its keras.losses.Loss of the targets
  and predictions it is handed (Keras divides such a Loss by the replicas,
  and then the model's own losses again)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.loss_fn = keras.losses.MeanSquaredError()

  def call(self, predictions, targets):
    self.add_loss(self.loss_fn(targets, predictions))
    return predictions


def endpoint():
  """Inputs (x, y), no labels: its only loss is the Endpoint's."""
  x, y = keras.Input((FEATURES,)), keras.Input((1,))
  hidden = keras.layers.Dense(8, activation="tanh")(x)
  model = keras.Model([x, y], Endpoint()(keras.layers.Dense(1)(hidden), y))
  model.compile(optimizer=keras.optimizers.SGD(0.05))
  return model


def endpoint_dataset_fn(split, input_context):
  """((x, y),): the targets are an input of the model, not its labels."""
  return dataset_fn(split, input_context).map(lambda x, y: ((x, y),))


# --- Callbacks -------------------------------------------------------------

class Recorder(keras.callbacks.Callback):
  """Records every hook fit calls, with its index and log keys."""

  def __init__(self):
    super().__init__()
    self.calls = []

  def _record(self, hook, index=None, logs=None):
    self.calls.append((hook, index, sorted(logs or {}),
                       {k: float(v) for k, v in (logs or {}).items()}))


for _hook in ("on_train_begin", "on_train_end", "on_test_begin",
              "on_test_end"):
  setattr(Recorder, _hook, (lambda hook: lambda self, logs=None:
                            self._record(hook, None, logs))(_hook))
for _hook in ("on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
              "on_train_batch_end", "on_test_batch_begin",
              "on_test_batch_end"):
  setattr(Recorder, _hook, (lambda hook: lambda self, index, logs=None:
                            self._record(hook, index, logs))(_hook))


def callbacks_of_an_argument(patience):
  """A callbacks factory dist_keras cannot call as train.callbacks()."""
  return [keras.callbacks.EarlyStopping(patience=patience)]


def no_list_of_callbacks():
  """A callbacks factory returning no list."""
  return 3


def early_stopping():
  """Stops when the eval loss improves by less than 0.05 for 2 epochs, and
  restores the best epoch's weights as training ends."""
  return keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.05,
                                       patience=2, restore_best_weights=True)


def reduce_lr():
  return keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5,
                                           min_delta=0.05, patience=1)


def callbacks_fn():
  """For train.callbacks: EarlyStopping, ReduceLROnPlateau, and the best
  model to $PARITY_BEST (ModelCheckpoint, save_best_only)."""
  return [early_stopping(), reduce_lr(),
          keras.callbacks.ModelCheckpoint(
              os.environ.get("PARITY_BEST") or os.path.join(
                  tempfile.gettempdir(), "parity_best.keras"),
              monitor="val_loss", save_best_only=True)]
