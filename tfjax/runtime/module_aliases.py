"""Old module spellings of a package whose modules moved into subpackages, kept working as the
SAME module objects: `import tfjax.training.checkpoint` is tfjax.training.checkpointing.checkpoint
(one entry in sys.modules under both names), so module state and a test's monkeypatch are shared,
and `python -m tfjax.training.main` runs the moved module's code.

Why a meta-path finder and not one shim file per old name: the package folder then shows only its
subpackages (the design), and the old spellings live in one table in the package's __init__.py.
A shim file that re-exports names would make a second module object (monkeypatching it would not
reach the code) or, replacing itself in sys.modules, would still sit in the folder.

`install(package, aliases, moved)`: `aliases` maps a module name directly under `package` to the
full name of the module it now is; `moved` maps names whose modules left the package to their
new home, for an ImportError that names it (a module of another layer is not re-exported).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Mapping


class _AliasLoader(importlib.abc.Loader):
  """Loads an old spelling as the module it names: no second module, no second execution."""

  def __init__(self, target: str):
    self.target = target
    self.target_spec = None

  def create_module(self, spec):
    module = importlib.import_module(self.target)
    self.target_spec = module.__spec__
    return module

  def exec_module(self, module):
    # The import system has just set module.__spec__ to the alias' spec; the module keeps its
    # own, so importlib.reload and pickling by module name see the real module.
    module.__spec__ = self.target_spec

  def get_code(self, fullname):  # pylint: disable=unused-argument
    """`python -m OLD.SPELLING` (runpy reads the code through the spec's loader)."""
    return importlib.util.find_spec(self.target).loader.get_code(self.target)


class AliasFinder(importlib.abc.MetaPathFinder):
  """Finds `package.<old name>` for the names of one package's alias and moved tables."""

  def __init__(self, package: str, aliases: Mapping[str, str], moved: Mapping[str, str]):
    self.package, self.aliases, self.moved = package, dict(aliases), dict(moved)

  def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
    prefix, _, name = fullname.rpartition(".")
    if prefix != self.package:
      return None
    if name in self.moved:
      raise ImportError(f"{fullname} is {self.moved[name]}: import it from there")
    if name not in self.aliases:
      return None
    real = importlib.util.find_spec(self.aliases[name])
    return importlib.machinery.ModuleSpec(fullname, _AliasLoader(self.aliases[name]),
                                          origin=real.origin if real else None)


def install(package: str, aliases: Mapping[str, str], moved: Mapping[str, str] = None):
  """Puts one AliasFinder for `package` first on sys.meta_path (once per package, so reloading
  the package does not stack finders)."""
  for finder in sys.meta_path:
    if isinstance(finder, AliasFinder) and finder.package == package:
      finder.aliases, finder.moved = dict(aliases), dict(moved or {})
      return finder
  finder = AliasFinder(package, aliases, moved or {})
  sys.meta_path.insert(0, finder)
  return finder
