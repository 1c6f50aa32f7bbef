"""Character-level LSTM language model on Tiny Shakespeare (TFDS).

The text is cut into windows of seq_len + 1 bytes; the model predicts each
next byte (256 classes). Loss and accuracy are per byte; perplexity is
exp(loss). Eval on the validation split (55,770 characters).

Prepare: python -m dist_keras.prepare_data tiny_shakespeare --data_dir DIR
         (on a machine with network, then copy DIR; DIR defaults to
         ~/tensorflow_datasets)
Run:     python -m dist_keras.train --config=lstm_lm_shakespeare \\
             --config.data.data_dir=DIR
Result:  not run on the real dataset here (no network); the pipeline is
         tested on mock data (tests/data/test_tfds.py).
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.data.name = "tfds:tiny_shakespeare"
  c.data.seq_len = 100
  # Bytes in, the next byte out (for data.name=synthetic).
  c.data.vocab_size = c.data.num_classes = 256
  c.model.name = "char_lm"
  c.model.cell = "lstm"
  c.model.embed_dim = 64
  c.model.units = 256
  c.model.num_layers = 2
  c.train.global_batch_size = 64
  c.train.learning_rate = 2e-3
  c.train.steps = 3000  # ~19 epochs of 10,038 windows at global batch 64.
  c.eval.every = 500
  c.train.checkpoint_every = 500
  c.log.perplexity = True  # exp(mean per-byte loss).
  return c
