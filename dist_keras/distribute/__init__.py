"""The distribution layer: which strategy (strategies.py), the cluster from
TF_CONFIG (tfconfig.py), TPU start-up (tpus.py) and the TPU runtime's
environment set before TensorFlow starts (tpu_env.py), and the per-replica
input pipelines handed to the strategy (pipelines.py); how a finished
cluster's workers leave together (leaving.py)."""
