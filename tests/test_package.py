"""The package layout: tfjax/nn (model blocks) <- tfjax/training (the system) <- tfjax/research
(the research workflow), with tfjax/hf importing models into runs, tfjax/aot compiling runs'
steps for absent hardware, and tfjax/data (prepared corpora) below the training system. Imports
point one way only."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfjax")
# Which subpackages each layer may import (besides itself and the standard/third-party libraries).
ALLOWED = {"nn": set(), "data": set(), "training": {"nn", "data"},
           "research": {"nn", "training", "data"}, "hf": {"nn", "training", "data"},
           "aot": {"nn", "training", "data"}}


def imported_tfjax_modules(path):
  """Every tfjax.* module a file imports, at top level or inside functions."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names if a.name.startswith("tfjax"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfjax"):
      yield node.module
      if node.module == "tfjax":  # from tfjax import nn, training
        yield from (f"tfjax.{a.name}" for a in node.names)


def layer_files():
  for layer in ALLOWED:
    for root, _, names in os.walk(os.path.join(PACKAGE, layer)):
      for name in names:
        if name.endswith(".py"):
          yield layer, os.path.join(root, name)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer):
  wrong = []
  for file_layer, path in layer_files():
    if file_layer != layer:
      continue
    for module in imported_tfjax_modules(path):
      parts = module.split(".")
      target = parts[1] if len(parts) > 1 else None
      if target in ALLOWED and target != layer and target not in ALLOWED[layer]:
        wrong.append(f"{os.path.relpath(path, PACKAGE)} imports {module}")
      if target in ("ops", "params"):  # the public shims are for users, not for the library
        wrong.append(f"{os.path.relpath(path, PACKAGE)} imports the shim {module}")
  assert not wrong, wrong


def test_the_checker_sees_a_violation(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from tfjax.training import train\n")
  assert list(imported_tfjax_modules(str(bad))) == ["tfjax.training"]


def test_public_spellings_are_the_same_modules():
  import tfjax.nn.ops  # pylint: disable=import-outside-toplevel
  import tfjax.ops  # pylint: disable=import-outside-toplevel
  import tfjax.params  # pylint: disable=import-outside-toplevel
  import tfjax.training.params  # pylint: disable=import-outside-toplevel
  assert tfjax.ops is tfjax.nn.ops and tfjax.params is tfjax.training.params
  assert callable(tfjax.ops.dot_product_attention)
