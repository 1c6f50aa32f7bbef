"""ResNet-50 on ImageNet (TFDS `imagenet2012`, eval on its validation split).

Train: random crops (8-100% of the area) resized to 224, random flips; eval:
shorter side to 256, central 224 crop; both normalised by ImageNet's channel
mean and std. Meant for GPUs or a TPU; on CPU a step takes seconds.

Prepare: TFDS cannot download ImageNet. Fetch ILSVRC2012_img_train.tar and
         ILSVRC2012_img_val.tar from image-net.org into MANUAL, then
         python -m dist_keras.prepare_data imagenet2012 --data_dir DIR \\
             --manual_dir MANUAL
         (~150 GB in DIR; a gs:// DIR works for TPUs)
Run:     python -m dist_keras.train --config=resnet50_imagenet \\
             --config.data.data_dir=DIR
Result:  not run on the real dataset here (no network, no accelerator); the
         pipeline is tested on mock data (tests/data/test_tfds.py).
Images/sec without ImageNet (random constant batches: compute + sync only):
         python -m dist_keras.train --config=resnet50_imagenet \\
             --config.data.name=synthetic --config.train.global_batch_size=64 \\
             --config.train.steps=100 --config.eval.every=0 \\
             --config.eval.steps=1
"""
from dist_keras.configs import base


def get_config():
  c = base.get_config()
  c.data.name = "tfds:imagenet2012"
  c.data.image_size = 224
  c.data.channels, c.data.num_classes = 3, 1000  # For data.name=synthetic.
  # Decoded 224x224x3 float32 images are 0.6 MB each: keep the buffer small.
  c.data.shuffle_buffer = 1024
  c.model.name = "resnet50"
  c.train.optimizer = "adamw"
  c.train.learning_rate = 1e-3
  c.train.global_batch_size = 1024
  c.train.steps = 112_600  # ~90 epochs of 1,281,167 at global batch 1024.
  c.train.log_every = 100
  c.train.checkpoint_every = 1000
  c.eval.every = 5000
  return c
