"""The user contract: model_fn() -> a compiled Keras model, dataset_fn(split,
input_context) -> per-replica batches. checks.py checks what model_fn
returns; model_calls.py calls the model and computes the compiled loss
the way the contract defines it; probe.py has the model meet its batches
once before training (a Probe of what it made of them); saving.py
whether Keras can save the model as model.keras (else its weights); batches.py
checks dataset_fn's batches and names them in messages; features.py a dict
of features against a model's dict of Inputs; imports.py loads
a user's PKG.MODULE:FN; fit_args.py refuses Keras' fit arguments given to
dist_keras.fit, naming what does their work; xla_limits.py what XLA and a
TPU cannot take from a model or its batches. (dist_keras/registry.py turns
a config's names into these functions.) Nothing here imports the layers
above it."""
