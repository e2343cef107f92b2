"""`--import=MODULE[,...]`: code outside the package (an attention kind, a position kind, a task
registered from a file of one's own) loaded the documented way, on every entry point.

Each MODULE is an importable module name (`my_kinds`, `lab.attention.sigmoid`: its folder on
PYTHONPATH, or its package pip-installed), or a path to a .py file (`path/to/my_kind.py`, loaded
as module `my_kind`, as --config takes a config file's path). Entry points import them before they
parse the config, so a kind registered there is a known model.attention_kind and its keys are
config keys (`--config.model.sigmoid_bias=...`).

What a process imported this way is recorded: `loaded()` is the default of config.imports
(tfjax/training/config/defaults.py), so it lands in every run's config.json, and whatever reads a
run back imports it again first (tfjax/training/config/run_config.py): a resume, `tfjax-generate` on
the run directory, `config.init_from`, export, and a sweep's child processes (which get `--import`).
A file path is recorded as an absolute path, so the run reads back from any directory.

A module that cannot be imported is a user's mistake: ImportFailed (a ValueError, so each entry
point prints it as one `error:` line) names the module, why, and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from typing import Iterable, Sequence

from tfjax.nn.choices import import_hint

FLAG = "import"  # the flag's name: --import=MODULE[,MODULE...], repeatable

_LOADED: list[str] = []  # what this process imported by --import, in order, each once


# Said with every unknown config key: the usual cause of a key that is right is its module.
UNKNOWN_KEY_HINT = import_hint("a key of a kind or position")


class ImportFailed(ValueError):
  """An --import module that could not be imported (the message names it and the fix)."""


def split(values: Iterable[str] | str | None) -> list[str]:
  """['a', 'b', 'c'] from 'a,b' / ['a,b', 'c'] / ('a', 'b', 'c'); empty parts dropped."""
  if values is None:
    return []
  if isinstance(values, str):
    values = [values]
  return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def from_argv(argv: Sequence[str]) -> list[str]:
  """The modules named by `--import=A,B` / `--import A,B` (repeatable) in a command line, read
  before any parser runs: absl config flags apply `--config.x=...` overrides while they are
  defined, so a kind's keys must be known by then."""
  return split(flag_values(argv, FLAG))


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
  """Every value of `--flag=V` / `--flag V` in a command line, as given."""
  found, args = [], list(argv)
  for i, arg in enumerate(args):
    if arg.startswith(f"--{flag}="):
      found.append(arg.split("=", 1)[1])
    elif arg == f"--{flag}" and i + 1 < len(args):
      found.append(args[i + 1])
  return found


def is_path(name: str) -> bool:
  """Whether an --import value names a .py file rather than a module."""
  return name.endswith(".py") or os.sep in name or "/" in name


def load(names: Iterable[str] | str | None, *, where: str = "--import") -> list[str]:
  """Imports each module (or .py file) of `names` not imported yet and records it (`loaded()`).
  Returns the recorded spellings (module names; files as absolute paths). `where` says in the
  error where the name came from (`--import`, or a run's config.json)."""
  recorded = []
  for name in split(names):
    spelling = os.path.abspath(name) if is_path(name) else name
    if spelling not in _LOADED:
      if is_path(name):
        _import_file(name, spelling, where)
      else:
        _import_module(name, where)
      _LOADED.append(spelling)
    recorded.append(spelling)
  return recorded


def loaded() -> tuple[str, ...]:
  """What this process imported by --import (or from a run's config.json), in order."""
  return tuple(_LOADED)


def load_recorded(values, source: str) -> list[str]:
  """Imports the modules a run's config.json records (its `imports` key: the run's --import),
  before the run's config is read. `values`: the JSON object; `source`: its path, for errors."""
  recorded = values.get("imports", ()) if isinstance(values, dict) else ()
  return load(recorded, where=f"{source} records --import")


def load_recorded_in(workdir: str) -> list[str]:
  """load_recorded of `workdir`'s config.json when there is one (an entry point given a run
  directory, e.g. a resume, imports them before it parses a config naming their kinds)."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path, encoding="utf-8") as f:
      values = json.load(f)
  except (OSError, ValueError):  # no run there yet, or not one: the entry point says so later
    return []
  return load_recorded(values, path)


def unknown_key_message(key: str, source: str, recorded: Sequence[str]) -> str:
  """The error of a config.json key this process does not know (`model.sigmoid_bias`)."""
  given = (f"the run records --import={','.join(recorded)}" if recorded else
           "the run records none: give this command --import=MODULE")
  return (f"unknown config key {key} in {source}: {UNKNOWN_KEY_HINT} ({given}); otherwise the "
          "run was written by a newer tfjax")


def _import_module(name: str, where: str) -> None:
  try:
    importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name is not None and name != e.name and not name.startswith(e.name + "."):
      raise ImportFailed(  # the module is there; something it imports is not
          f"{where}={name}: the module imports {e.name!r}, which is not installed (pip install "
          "the package that provides it)") from e
    raise ImportFailed(
        f"{where}={name}: no module named {name!r} on this Python's path (add the folder that "
        "holds it to PYTHONPATH, e.g. PYTHONPATH=examples, pip install the package that "
        "provides it, or give the path of its .py file)") from e
  except Exception as e:  # pylint: disable=broad-except  (the module's own code failed)
    raise ImportFailed(f"{where}={name}: importing the module failed: {type(e).__name__}: "
                       f"{e} (fix the module, or drop it from --import)") from e


def _import_file(name: str, path: str, where: str) -> None:
  if not os.path.isfile(path):
    raise ImportFailed(f"{where}={name}: no such file {path!r} (give the path of a .py file, or "
                       "an importable module name with its folder on PYTHONPATH)")
  module_name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except  (the file's own code failed)
    del sys.modules[module_name]
    raise ImportFailed(f"{where}={name}: importing the file failed: {type(e).__name__}: {e} "
                       "(fix the file, or drop it from --import)") from e
