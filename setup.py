"""dist-keras: data-parallel training of Keras 3 models with tf.distribute.

TensorFlow itself comes through an extra so that a Colab / TPU image's own
TensorFlow build is never replaced: pick exactly one of [cpu], [cuda], [tpu].
"""
import setuptools

_TF = ">=2.16,<2.22"

setuptools.setup(
    name="dist-keras",
    version="0.1.0",
    description="Data-parallel training of Keras 3 models with tf.distribute, "
    "with the cost of synchronisation measured.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["dist_keras", "dist_keras.*"]),
    install_requires=[
        "keras>=3",
        "tensorflow-datasets",
        "absl-py",
        "ml-collections",
        "tensorboard",
        # tensorflow-datasets imports it but does not declare it.
        "importlib_resources",
        "numpy",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu{_TF}"],
        "cuda": [f"tensorflow[and-cuda]{_TF}"],
        # tensorflow-tpu stops at 2.20; Colab TPU runtimes ship their own.
        "tpu": [f"tensorflow-tpu{_TF}"],
        "test": ["pytest", "pytest-timeout"],
        # TensorBoard's Profile tab, for traces from log.profile_steps.
        "profile": ["tensorboard-plugin-profile"],
    },
    entry_points={
        "console_scripts": ["dist-keras-train=dist_keras.train:run"],
    },
)
