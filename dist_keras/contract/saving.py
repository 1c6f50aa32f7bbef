"""Whether the model can be saved as model.keras, known before training.

A run ends by saving the model (workdir/model.keras); a model Keras cannot
save would fail only there, after every step had run and every checkpoint
was written, and every rerun would fail alike. Keras' save begins by
serializing the model (its layers' get_config(), its build and compile
configs) to JSON; that is where such a model fails, and it writes nothing
and reads no weight, so it is checked here in the same way.
"""
import warnings

from dist_keras.errors import UserError

GUIDE = "https://keras.io/guides/serialization_and_saving/"


def check_savable(model) -> None:
  """Raises UserError if Keras cannot serialize `model` as model.save does
  first (`model.to_json()`: the config model.keras holds, as JSON).

  Its warnings (a lambda's) are left for the real save to give.
  """
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      model.to_json()
  # Whatever a user's get_config() raises fails the final save alike.
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(
        f"model {model.name!r} cannot be saved as model.keras "
        f"({_first_paragraph(e)}); give each custom "
        "layer, loss or metric a get_config() that returns its __init__ "
        f"arguments as plain values ({GUIDE}).") from e


def _first_paragraph(error: Exception, limit: int = 300) -> str:
  """The message's first paragraph as one line: Keras says what is wrong
  there, and gives a multi-line example after a blank line."""
  text = str(error).strip()
  paragraph = text.split("\n\n", 1)[0] if text else type(error).__name__
  line = " ".join(paragraph.split()).rstrip(".")
  return line if len(line) <= limit else line[:limit - 3] + "..."
