"""`dist_keras.configs` when dist_keras is imported from a checkout as is.

configs/ sits at the top of the repository and is installed as
`dist_keras.configs` (setup.py's package_dir); an editable install maps it
with its own import hook. A checkout reached through the working directory
(`python -m dist_keras.train` run from it, a Docker WORKDIR holding the
source, a notebook that `%cd`s into its clone) has neither: the installed
package is shadowed and `dist_keras.configs` was a ModuleNotFoundError.
"""
import importlib.abc
import importlib.util
import os
import sys

_NAME = "dist_keras.configs"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FOLDER = os.path.join(_ROOT, "configs")


class _ConfigsFinder(importlib.abc.MetaPathFinder):
  """Finds `dist_keras.configs` in the checkout's configs/, last of all
  finders (an installed or editable package's own mapping comes first)."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name != _NAME:
      return None
    return importlib.util.spec_from_file_location(
        name, os.path.join(_FOLDER, "__init__.py"),
        submodule_search_locations=[_FOLDER])


def install() -> None:
  """Adds the finder once, only beside a checkout's configs/."""
  inside = os.path.isdir(os.path.join(_ROOT, "dist_keras", "configs"))
  beside = os.path.isfile(os.path.join(_FOLDER, "base.py"))
  if beside and not inside and not any(
      isinstance(f, _ConfigsFinder) for f in sys.meta_path):
    sys.meta_path.append(_ConfigsFinder())
