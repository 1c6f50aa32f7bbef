"""dist-keras: data-parallel training of Keras 3 models with tf.distribute.

TensorFlow itself comes through an extra so that a Colab / TPU image's own
TensorFlow build is never replaced: pick exactly one of [cpu], [cuda], [tpu].
"""
import setuptools

_TF = ">=2.16,<2.22"
_ML_DTYPES = "ml-dtypes<0.7"

setuptools.setup(
    name="dist-keras",
    version="0.1.0",
    description="Data-parallel training of Keras 3 models with tf.distribute, "
    "with the cost of synchronisation measured.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # configs/ stays at the top of the repository (where users look for it)
    # and ships inside the package as dist_keras.configs, so an installed
    # dist_keras runs its built-in configs from any directory.
    packages=[*setuptools.find_packages(include=["dist_keras", "dist_keras.*"]),
              "dist_keras.configs"],
    package_dir={"dist_keras.configs": "configs"},
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
        # ml-dtypes 0.7.0 (pip's pick for TF 2.21, which asks for >=0.5.1,
        # <1) takes 0.8-1.3 CPU-s to import (py-spy: numpy's PyUFunc_AddLoop
        # under PyUFunc_AddPromoter), 0.6.0 0.01 s: a quarter of `import
        # tensorflow`, in every process of every run (measured 2026-12-07,
        # docs/testing.md).
        "cpu": [f"tensorflow-cpu{_TF}", _ML_DTYPES],
        "cuda": [f"tensorflow[and-cuda]{_TF}", _ML_DTYPES],
        # tensorflow-tpu stops at 2.20 (PyPI: 2.16.1-2.20.0). Colab's TPU
        # runtimes no longer ship TensorFlow (since March 2025), so Colab
        # needs this extra too. tensorflow-tpu 2.20.0 asks for libtpu~=0.0.14,
        # but `import tensorflow` aborts ("... not available in this
        # library") with the newest libtpu, pip's pick. Measured (no TPU):
        # import OK with 0.0.14, 0.0.24, 0.0.29, 0.0.31; abort with 0.0.32,
        # 0.0.32.1, 0.0.33, 0.0.43.2, 0.0.52. tensorflow-tpu 2.16-2.18 need
        # libtpu builds that are not on PyPI, hence >=2.19. pip's resolver
        # (2026-12-01): tensorflow-tpu 2.20.0 + libtpu 0.0.31 on Python 3.11
        # and on Colab's 3.12/glibc 2.35 (docs/tpu_colab.md#install).
        "tpu": ["tensorflow-tpu>=2.19,<2.21", "libtpu<0.0.32"],
        # nbclient, nbformat, ipykernel: tests/package/test_notebook.py runs
        # notebooks/colab_tpu.ipynb (it is skipped without them).
        # Not matplotlib: where it is installed, `import keras` imports
        # matplotlib.pyplot (~1.2 CPU-s of every TensorFlow process the
        # tests start); the scaling plot's test is in the slow set, which
        # installs the tools extra (docs/testing.md).
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "nbclient", "nbformat",
                 "ipykernel"],
        # dist_keras.fit as Ray Train's train_loop_per_worker reports to Ray
        # (docs/ray.md); not in [test]: only the slow set runs Ray.
        "ray": ["ray[train]"],
        # TensorBoard's Profile tab, for traces from log.profile_steps.
        "profile": ["tensorboard-plugin-profile"],
        # tools/scaling.py's figure (scaling.png).
        "tools": ["matplotlib"],
    },
    entry_points={
        # The local launcher, as `python -m dist_keras.launch` too.
        "console_scripts": ["dist-keras-train=dist_keras.train:run",
                            "dist-keras-launch=dist_keras.launch.cli:main"],
    },
)
