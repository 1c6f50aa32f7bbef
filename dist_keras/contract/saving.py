"""Whether the model can be saved as model.keras, known before training.

A run ends by saving the model. Keras' save begins by serializing the
model (its layers' get_config(), its build and compile configs) to JSON;
a model whose config Keras cannot write (a subclassed model whose
__init__ takes sub-models or other arguments and that has no
get_config(), as keras.io's GANs and VAE; a custom layer that takes a
function) still trains under Keras' fit, which writes no file. Such a
model trains here too, and the run saves what Keras can save of it, its
weights (model.save_weights), saying so before the first step: found
here as model.save would find it, writing nothing and reading no weight.
A get_config() that raises for a reason of its own (a bug in it) is
treated alike, its error named: the run's training is not its saving.
"""
import warnings

GUIDE = "https://keras.io/guides/serialization_and_saving/"
WHOLE = "model.keras"
WEIGHTS = "model.weights.h5"


def unsavable(model) -> str | None:
  """Why Keras cannot serialize `model` as model.save does first
  (`model.to_json()`: the config model.keras holds, as JSON), in one
  line; None when it can.

  Its warnings (a lambda's) are left for the real save to give.
  """
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      model.to_json()
  # Whatever a user's get_config() raises fails model.save alike.
  except Exception as e:  # pylint: disable=broad-except
    # Keras' own refusal says what is wrong; another error (a bug in a
    # get_config) is named by its type too.
    named = "" if isinstance(e, NotImplementedError) else (
        f"{type(e).__name__}: ")
    return named + _first_paragraph(e)
  return None


def weights_only_line(model, why: str) -> str:
  """The line a run whose model Keras cannot save whole says at its start:
  what it saves instead, why, and how to have model.keras."""
  return (f"model {model.name!r} cannot be saved as {WHOLE} ({why}); the "
          f"run saves its weights as {WEIGHTS} instead (load them with "
          "model.load_weights(path) into the model model_fn builds). For "
          f"{WHOLE}, give the model and each custom layer, loss or metric a "
          "get_config() that returns its __init__ arguments (a model or "
          "layer among them as keras.saving.serialize_keras_object(it)) and "
          f"a from_config() that deserializes those ({GUIDE})")


def _first_paragraph(error: Exception, limit: int = 300) -> str:
  """The message's first paragraph as one line: Keras says what is wrong
  there, and gives a multi-line example after a blank line."""
  text = str(error).strip()
  paragraph = text.split("\n\n", 1)[0] if text else type(error).__name__
  line = " ".join(paragraph.split()).rstrip(".")
  return line if len(line) <= limit else line[:limit - 3] + "..."
