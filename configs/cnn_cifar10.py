"""CNN on CIFAR-10 (TFDS `cifar10`, 32x32 RGB; eval on its test split).

Prepare: python -m dist_keras.prepare_data cifar10 --data_dir DIR
         (on a machine with network, then copy DIR; DIR defaults to
         ~/tensorflow_datasets)
Run:     python -m dist_keras.train --config=cnn_cifar10 \\
             --config.data.data_dir=DIR
Result:  not run on the real dataset here (no network); the pipeline is
         tested on mock data (tests/data/test_tfds.py).
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.data.name = "tfds:cifar10"
  c.data.image_size = 32  # Native size: no resize.
  c.data.channels, c.data.num_classes = 3, 10  # For data.name=synthetic.
  c.model.name = "cnn"
  c.model.filters = (32, 64, 128)
  c.model.dense_units = 128
  c.train.learning_rate = 1e-3
  c.train.steps = 5000  # ~25 epochs of 50,000 at global batch 256.
  c.eval.every = 500
  c.train.checkpoint_every = 500
  return c
