"""LSTM sentiment classifier on IMDB reviews (TFDS `imdb_reviews`).

Words are hashed into data.vocab_size buckets (no vocabulary to build, share
or save; see dist_keras/data/tfds_sources.py); each review keeps its last
data.seq_len words. Eval on the 25,000-review test split.

Prepare: python -m dist_keras.prepare_data imdb_reviews --data_dir DIR
         (on a machine with network, then copy DIR; DIR defaults to
         ~/tensorflow_datasets)
Run:     python -m dist_keras.train --config=lstm_imdb \\
             --config.data.data_dir=DIR
Result:  not run on the real dataset here (no network); the pipeline and a
         few train steps are tested on mock data (tests/data/test_tfds.py).
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.data.name = "tfds:imdb_reviews"
  c.data.seq_len = 200
  c.data.vocab_size = 20000  # Hash buckets + 1 for padding.
  c.data.num_classes = 2  # For data.name=synthetic.
  c.model.name = "sequence_classifier"
  c.model.cell = "lstm"
  c.model.embed_dim = 64
  c.model.units = 64
  c.train.learning_rate = 1e-3
  c.train.steps = 1000  # ~10 epochs of 25,000 at global batch 256.
  c.eval.every = 250
  return c
