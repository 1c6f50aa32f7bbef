"""A user's config: their own model and data, named by import path.

It lives outside dist_keras and imports nothing of it but the base config.
Run from this folder (the import paths resolve from the current directory),
as two workers on this machine:

  cd examples/binary
  python -m dist_keras.launch --num_workers=2 -- \\
      python -m dist_keras.train --config=binary_config.py --workdir=/tmp/binary

or as one process (`python -m dist_keras.train --config=binary_config.py`),
or on a cluster: the same command on every worker, TF_CONFIG set by the
launcher or the Kubernetes operator (docs/kubernetes.md).
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.model.name = "binary_task:model_fn"
  c.data.name = "binary_task:dataset_fn"
  c.train.global_batch_size = 128  # binary_task.GLOBAL_BATCH.
  c.train.steps = 600
  c.train.log_every = 50
  c.eval.every = 200
  return c
