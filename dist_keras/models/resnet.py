"""ResNet-50 (keras.applications), randomly initialised, logits out.

Its batch normalisation uses per-replica batch statistics (Keras' default),
as in the usual data-parallel ImageNet recipes; N replicas therefore differ
slightly from one device, unlike the BN-free models the equivalence tests use.
"""
import keras

from dist_keras.errors import UserError

MIN_SIDE = 32  # keras.applications.ResNet50 refuses smaller inputs.


def check(model_cfg, input_spec) -> None:
  """Raises UserError for inputs ResNet-50 cannot take."""
  del model_cfg  # ResNet-50 has no settings here.
  shape = input_spec.shape
  if len(shape) != 3 or min(shape[:2]) < MIN_SIDE:
    raise UserError(f"model.name='resnet50' needs images of at least "
                    f"{MIN_SIDE}x{MIN_SIDE}, got inputs {shape}; use it with "
                    "data.name=tfds:imagenet2012 (data.image_size=224).")


def build(model_cfg, input_spec) -> keras.Model:
  """ResNet-50 for `input_spec`; no softmax: the loss takes logits."""
  del model_cfg
  return keras.applications.ResNet50(
      weights=None, input_shape=input_spec.shape,
      classes=input_spec.num_classes, classifier_activation=None)
