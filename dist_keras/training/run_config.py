"""config.json: the config a run was asked for (the values dist_keras
chooses for it, such as steps per call for a callback's batch hooks, are
said at the start and kept in summary.json's "chosen": report.chosen), of
the run the workdir's checkpoints are
of; and what a rerun says changed since.

A rerun resumes the checkpoints an earlier run saved: until it saves one of
its own they are that run's, and so is config.json. A rerun that fails, or
is killed, before its first checkpoint leaves it as it was: the next rerun
compares itself with the run it resumes, not with one that kept nothing.
"""
import json
import os

import tensorflow as tf

from dist_keras.training.run_files import CONFIG_JSON, read_json, write_json

# What config_changes' line says of config.json: this run's written at its
# start, with its first checkpoint (a resumed run), or not at all.
NOW, AT_FIRST_CHECKPOINT, NOT_APPLIED = (
    "config.json now holds this run's",
    "config.json takes this run's with its first checkpoint",
    "not applied: the workdir's run had finished, and its config.json is "
    "kept")


# The config a resumed run's chief writes with its first checkpoint:
# {absolute workdir: config}.
_PENDING = {}


def record(workdir: str, config: dict, resumed: bool) -> str:
  """The line naming what changed since the workdir's config.json
  (config_changes, "" for nothing); then `config` is written there now,
  or, for a run that `resumed` an earlier run's checkpoints, with its
  first own (saved())."""
  key = os.path.abspath(workdir)
  line = config_changes(workdir, config,
                        kept=AT_FIRST_CHECKPOINT if resumed else NOW)
  _PENDING.pop(key, None)  # (An earlier run's, which saved none.)
  if resumed:
    _PENDING[key] = config
  else:
    write_json(workdir, CONFIG_JSON, config)
  return line


def saved(workdir: str) -> None:
  """After the chief saved a checkpoint: a resumed run's config.json."""
  config = _PENDING.pop(os.path.abspath(workdir), None)
  if config is not None:
    write_json(workdir, CONFIG_JSON, config)


def config_changes(workdir: str, config: dict, shown: int = 6,
                   kept: str = NOW) -> str:
  """One line naming each key whose value differs from the workdir's
  config.json (the run its checkpoints are of), "" for none or no file: a
  rerun in the same folder resumes whatever was trained there, so a
  changed batch size, task or rate must not pass unsaid, nor a config.json
  that cannot be compared. `kept`: when config.json takes this run's."""
  if not tf.io.gfile.exists(os.path.join(workdir, CONFIG_JSON)):
    return ""
  try:
    before = _flat(read_json(workdir, CONFIG_JSON))
  except (tf.errors.OpError, OSError, ValueError, AttributeError) as e:
    return (f"this workdir's config.json is unreadable ({type(e).__name__}), "
            f"so what changed since its last run is unknown ({kept})")
  now = _flat(json.loads(json.dumps(config)))  # Tuples as JSON has them.
  changed = [f"{key} {json.dumps(before.get(key))} -> "
             f"{json.dumps(now.get(key))}"
             for key in sorted(before.keys() | now.keys())
             if before.get(key) != now.get(key)]
  if not changed:
    return ""
  more = (f" and {len(changed) - shown} more" if len(changed) > shown
          else "")
  return (f"config changed since this workdir's last run: "
          f"{', '.join(changed[:shown])}{more} ({kept})")


def _flat(tree: dict, prefix: str = "") -> dict:
  """{"section.key": value} of a nested dict."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat
