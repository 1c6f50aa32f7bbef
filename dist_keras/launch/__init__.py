"""The local launcher: a MultiWorkerMirroredStrategy cluster as processes
on this machine (or one task of a hand-made cluster), each worker with its
TF_CONFIG.

  python -m dist_keras.launch --num_workers=2 -- python -m dist_keras.train
  dist-keras-launch ...   # The console script of the same.

Flags, exit codes and limits: cli.py. It only starts processes: nothing
here imports TensorFlow.
"""
