"""Four models as users write them, for tools/bench.py against Keras' fit.

Each is a model_fn (builds and compiles) and a dataset_fn(split,
input_context) of per-replica batches, on synthetic data shaped like the
real kind, so the bench runs here without a download
(docs/performance.md, "Your own models"):

  python tools/bench.py --override=model.name=bench_models:text_model_fn \\
      --override=data.name=bench_models:text_dataset_fn \\
      --override=train.global_batch_size=64 --rounds=3 --epochs=3 --steps=30

text (keras.io's transformer classifier, global batch TEXT_BATCH), cnn
(BatchNormalization and Dropout on 32x32x3 images, IMG_BATCH),
wide_deep (dict features, two Embeddings, AUC, WD_BATCH) and deep_mlp (48
residual blocks, 194 variables in all, MLP_BATCH: small steps, a long
trace, for start-up: docs/sync_breakdown.md). The same module
trains from the command line: PYTHONPATH=tools python -m dist_keras.train
--config.model.name=bench_models:cnn_model_fn ...
"""
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

# The text classifier.
# keras.io/examples/nlp/text_classification_with_transformer (Keras 3).
MAXLEN, VOCAB, TEXT_BATCH = 200, 20000, 64
EMBED, HEADS, FF = 32, 2, 32


class TransformerBlock(layers.Layer):
  def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kw):
    super().__init__(**kw)
    self.att = layers.MultiHeadAttention(num_heads=num_heads,
                                         key_dim=embed_dim)
    self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                 layers.Dense(embed_dim)])
    self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
    self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
    self.dropout1 = layers.Dropout(rate)
    self.dropout2 = layers.Dropout(rate)

  def call(self, inputs):
    attn_output = self.att(inputs, inputs)
    attn_output = self.dropout1(attn_output)
    out1 = self.layernorm1(inputs + attn_output)
    ffn_output = self.ffn(out1)
    ffn_output = self.dropout2(ffn_output)
    return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
  def __init__(self, maxlen, vocab_size, embed_dim, **kw):
    super().__init__(**kw)
    self.token_emb = layers.Embedding(input_dim=vocab_size,
                                      output_dim=embed_dim)
    self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

  def call(self, x):
    maxlen = ops.shape(x)[-1]
    positions = ops.arange(start=0, stop=maxlen, step=1)
    positions = self.pos_emb(positions)
    x = self.token_emb(x)
    return x + positions


def text_model_fn():
  inputs = layers.Input(shape=(MAXLEN,))
  x = TokenAndPositionEmbedding(MAXLEN, VOCAB, EMBED)(inputs)
  x = TransformerBlock(EMBED, HEADS, FF)(x)
  x = layers.GlobalAveragePooling1D()(x)
  x = layers.Dropout(0.1)(x)
  x = layers.Dense(20, activation="relu")(x)
  x = layers.Dropout(0.1)(x)
  outputs = layers.Dense(2, activation="softmax")(x)
  model = keras.Model(inputs=inputs, outputs=outputs)
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
  return model


def _imdb_like(n, seed):
  """Review-like ids: Zipf words, lengths ~ IMDB's (median ~175 words),
  pre-padded with 0 / truncated to MAXLEN as keras.utils.pad_sequences;
  the label is whether 'good' words (ids 10-29) outnumber 'bad' (30-49)."""
  rng = np.random.default_rng(seed)
  lengths = np.clip(rng.lognormal(5.2, 0.6, n).astype(int), 10, 2000)
  x = np.zeros((n, MAXLEN), np.int32)
  y = np.zeros((n,), np.int32)
  for i, length in enumerate(lengths):
    words = np.minimum(rng.zipf(1.3, length), VOCAB - 1).astype(np.int32)
    words = words[:MAXLEN]
    x[i, MAXLEN - len(words):] = words
    good = np.sum((words >= 10) & (words < 30))
    bad = np.sum((words >= 30) & (words < 50))
    y[i] = int(good > bad)
  return x, y


def _pipeline(arrays, split, input_context, global_batch, size):
  ds = tf.data.Dataset.from_tensor_slices(arrays)
  ds = ds.shard(input_context.num_input_pipelines,
                input_context.input_pipeline_id)
  batch = input_context.get_per_replica_batch_size(global_batch)
  if split == "train":
    return ds.shuffle(size, seed=0).repeat().batch(batch, drop_remainder=True)
  return ds.batch(batch)


def text_dataset_fn(split, input_context):
  n = 8192 if split == "train" else 1024
  x, y = _imdb_like(n, {"train": 0, "eval": 1}[split])
  return _pipeline((x, y), split, input_context, TEXT_BATCH, n)


# The CNN.
IMG_BATCH = 128


def cnn_model_fn():
  model = keras.Sequential([
      keras.Input((32, 32, 3)),
      layers.Rescaling(1.0 / 255),
      layers.Conv2D(16, 3, padding="same", use_bias=False),
      layers.BatchNormalization(), layers.Activation("relu"),
      layers.MaxPooling2D(),
      layers.Conv2D(32, 3, padding="same", use_bias=False),
      layers.BatchNormalization(), layers.Activation("relu"),
      layers.MaxPooling2D(),
      layers.Conv2D(64, 3, padding="same", use_bias=False),
      layers.BatchNormalization(), layers.Activation("relu"),
      layers.MaxPooling2D(),
      layers.Dropout(0.25),
      layers.GlobalAveragePooling2D(),
      layers.Dense(64, activation="relu"),
      layers.Dropout(0.5),
      layers.Dense(10),
  ])
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=["accuracy"])
  return model


def cnn_dataset_fn(split, input_context):
  """CIFAR-shaped uint8 images; the class sets one channel's brightness."""
  n = 4096 if split == "train" else 1024
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  y = rng.integers(0, 10, n).astype(np.int32)
  x = rng.integers(0, 200, (n, 32, 32, 3)).astype(np.uint8)
  x[..., 0] = np.minimum(x[..., 0] + 5 * y[:, None, None], 255).astype(np.uint8)
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  ds = ds.shard(input_context.num_input_pipelines,
                input_context.input_pipeline_id)
  ds = ds.map(lambda a, b: (tf.cast(a, tf.float32), b))
  batch = input_context.get_per_replica_batch_size(IMG_BATCH)
  if split == "train":
    return ds.shuffle(n, seed=0).repeat().batch(batch, drop_remainder=True)
  return ds.batch(batch)


# The wide-and-deep model.
WD_BATCH, VOCAB_A, VOCAB_B, NUMERIC = 256, 50000, 1000, 13


def wide_deep_model_fn():
  inputs = {"user_id": keras.Input((), dtype="int32", name="user_id"),
            "category": keras.Input((), dtype="int32", name="category"),
            "numeric": keras.Input((NUMERIC,), name="numeric")}
  ua = layers.Embedding(VOCAB_A, 64, name="user_emb")(inputs["user_id"])
  cb = layers.Embedding(VOCAB_B, 16, name="cat_emb")(inputs["category"])
  deep = layers.Concatenate()([ua, cb, inputs["numeric"]])
  deep = layers.Dense(512, activation="relu")(deep)
  deep = layers.Dense(256, activation="relu")(deep)
  deep = layers.Dense(128, activation="relu")(deep)
  deep = layers.Dense(1)(deep)
  wide_a = layers.Embedding(VOCAB_A, 1, name="user_wide")(inputs["user_id"])
  wide_b = layers.Embedding(VOCAB_B, 1, name="cat_wide")(inputs["category"])
  wide = layers.Add()([wide_a, wide_b, layers.Dense(1)(inputs["numeric"])])
  out = layers.Activation("sigmoid")(layers.Add()([deep, wide]))
  model = keras.Model(inputs, out)
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss="binary_crossentropy",
                metrics=[keras.metrics.AUC(name="auc"), "accuracy"])
  return model


def wide_deep_dataset_fn(split, input_context):
  """Click-log-like rows: Zipf user ids, uniform categories, 13 numbers."""
  n = 65536 if split == "train" else 4096
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  user = np.minimum(rng.zipf(1.2, n), VOCAB_A - 1).astype(np.int32)
  cat = rng.integers(0, VOCAB_B, n).astype(np.int32)
  num = rng.normal(size=(n, NUMERIC)).astype(np.float32)
  logit = num[:, 0] - num[:, 1] + 0.5 * ((cat % 7) == 0) + 0.3 * (user < 5)
  y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
  return _pipeline(({"user_id": user, "category": cat, "numeric": num}, y),
                   split, input_context, WD_BATCH, n)


# The deep MLP: 48 blocks of Dense 64 (gelu) + a residual + LayerNorm.
MLP_BLOCKS, MLP_WIDTH, MLP_BATCH = 48, 64, 64


def deep_mlp_model_fn():
  inputs = keras.Input((MLP_WIDTH,))
  x = inputs
  for _ in range(MLP_BLOCKS):
    x = layers.LayerNormalization()(
        layers.Dense(MLP_WIDTH, activation="gelu")(x) + x)
  model = keras.Model(inputs, layers.Dense(1)(x))
  model.compile(optimizer="adamw", loss="mse", metrics=["mae"])
  return model


def deep_mlp_dataset_fn(split, input_context):
  """Uniform rows; the target is their sum."""
  n = 4096
  rng = np.random.default_rng({"train": 0, "eval": 1}[split])
  x = rng.random((n, MLP_WIDTH), dtype=np.float32)
  return _pipeline((x, x.sum(1, keepdims=True)), split, input_context,
                   MLP_BATCH, n)
