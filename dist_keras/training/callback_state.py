"""Users' callbacks' state over a resume.

Keras' fit with BackupAndRestore resumes the weights, the optimizer and
the epoch, and no callback's state: after a resume an EarlyStopping counts
its patience again from 0, compares with no best value, and can restore no
weights from before it. dist_keras keeps in each checkpoint
(run_record.py) the attributes Keras' own stateful callbacks act on, and
sets them again after their on_train_begin (which resets them), so that
they go on as if the run had not stopped. Another callback's state (one
of your own, a LambdaCallback's functions, a CSVLogger that does not
append) cannot be known: it is named in one line at the resume.
"""
import keras
import numpy as np

# The attributes each acts on; matched by isinstance, so that a subclass
# keeps what its Keras class has (and is named for the rest).
_KEPT = (
    (keras.callbacks.EarlyStopping,
     ("wait", "best", "best_epoch", "stopped_epoch", "best_weights")),
    (keras.callbacks.ReduceLROnPlateau, ("wait", "best", "cooldown_counter")),
    (keras.callbacks.ModelCheckpoint,
     ("best", "_batches_seen_since_last_saving", "_last_batch_seen")),
    # Whether the averages are in the model, as they are at an epoch's end
    # (when the checkpoint is saved) with swap_on_epoch: the next epoch's
    # begin swaps them back only if it knows.
    (keras.callbacks.SwapEMAWeights, ("_ema_weights_in_model",)),
    # Its batch-level summaries' step and the profiled batches.
    (keras.callbacks.TensorBoard, ("_global_train_batch",)),
)
# Nothing of theirs is lost: they act on the epoch index, the model or the
# optimizer (checkpointed), or only print.
_NOTHING_LOST = (keras.callbacks.History,
                 keras.callbacks.LearningRateScheduler,
                 keras.callbacks.TerminateOnNaN,
                 keras.callbacks.ProgbarLogger,
                 keras.callbacks.RemoteMonitor)


def _attributes(callback) -> tuple:
  for kind, names in _KEPT:
    if isinstance(callback, kind):
      return names
  return ()


def _identity(callback) -> dict:
  """What must match for a checkpoint's state to be this callback's."""
  return {"class": type(callback).__name__,
          "monitor": getattr(callback, "monitor", None)}


def states(callbacks: list, arrays: dict) -> list:
  """Each callback's kept attributes, JSON-able; arrays (best weights) go
  into `arrays`, named."""
  out = []
  for i, callback in enumerate(callbacks):
    state = {name: _encode(getattr(callback, name, None),
                           f"callbacks.{i}.{name}", arrays)
             for name in _attributes(callback)}
    out.append({**_identity(callback), "state": state})
  return out


def _encode(value, key: str, arrays: dict):
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)):
    return {"list": [_encode(v, f"{key}.{j}", arrays)
                     for j, v in enumerate(value)]}
  value = np.asarray(value)
  if value.ndim == 0:
    return value.item()
  arrays[key] = value
  return {"array": key}


def _decode(value, arrays: dict):
  if not isinstance(value, dict):
    return value
  if "list" in value:
    return [_decode(v, arrays) for v in value["list"]]
  return arrays[value["array"]]


def restore(callbacks: list, saved: list | None, arrays: dict) -> str:
  """Sets each callback's kept attributes to the checkpoint's (`saved`:
  states() then; None: a checkpoint that holds none), after their
  on_train_begin; returns the line that says what was kept and what not
  ("" when nothing of theirs had state)."""
  kept, lost = [], []
  for i, callback in enumerate(callbacks):
    names, name = _attributes(callback), type(callback).__name__
    entry = saved[i] if saved and i < len(saved) else None
    if names and entry and {k: entry.get(k) for k in ("class", "monitor")
                            } == _identity(callback):
      for attribute, value in entry["state"].items():
        setattr(callback, attribute, _decode(value, arrays))
      kept.append(f"{name} ({_shown(entry['state'])})")
    elif names:
      lost.append(f"{name} (the checkpoint holds no state of it)")
    why = _lost(callback, bool(names))
    if why:
      lost.append(f"{name} ({why})")
  said = [f"kept {', '.join(kept)}" if kept else "",
          f"not kept: {', '.join(lost)}" if lost else ""]
  return ("callbacks over the resume: " + "; ".join(filter(None, said))
          if kept or lost else "")


def _shown(state: dict) -> str:
  """'wait=1, best=0.3125, best_epoch=0, best_weights'."""
  return ", ".join(
      f"{k}={v:.4g}" if isinstance(v, float) else
      f"{k}={v}" if v is None or isinstance(v, (bool, int)) else k
      for k, v in state.items())


def _lost(callback, known: bool) -> str:
  """What `callback` loses over a resume that is not kept ("": nothing)."""
  if isinstance(callback, keras.callbacks.CSVLogger):
    return ("" if callback.append else "append=False: it writes its file "
            "again from this epoch, without the rows before")
  if type(callback) in {kind for kind, _ in _KEPT} or isinstance(
      callback, _NOTHING_LOST):
    return ""
  if known:
    return "its own attributes beyond its Keras class's start as new"
  return "its own attributes start as new"
