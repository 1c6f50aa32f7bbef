"""CNN on MNIST digits (TFDS `mnist`, 28x28 grey; eval on its test split).

Prepare: python -m dist_keras.prepare_data mnist --data_dir DIR
         (on a machine with network, then copy DIR; DIR defaults to
         ~/tensorflow_datasets)
Run:     python -m dist_keras.train --config=cnn_mnist \\
             --config.data.data_dir=DIR
Result:  not run on the real dataset here (no network); the pipeline and a
         few train steps are tested on mock data (tests/data/test_tfds.py).
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.data.name = "tfds:mnist"
  c.data.image_size = 28  # Native size: no resize.
  c.data.channels, c.data.num_classes = 1, 10  # For data.name=synthetic.
  c.model.name = "cnn"
  c.model.filters = (32, 64)
  c.model.dense_units = 128
  c.train.learning_rate = 1e-3
  c.train.steps = 1000  # ~4 epochs of 60,000 at global batch 256.
  c.eval.every = 250
  return c
