"""The user contract: model_fn() -> a compiled Keras model, dataset_fn(split,
input_context) -> per-replica batches. checks.py checks what they return and
computes the compiled loss the way the contract defines it; imports.py loads
a user's PKG.MODULE:FN. (dist_keras/registry.py turns a config's names into
these functions.) Nothing here imports the layers above it."""
