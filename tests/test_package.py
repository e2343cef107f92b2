"""The package layout, imports pointing one way only: tfjax/nn (model blocks) <- tfjax/runtime
(files, locks, caches, processes) <- tfjax/data (datasets, tokenizers, prepared corpora) <-
tfjax/inference (generation) <- tfjax/training (the loop) <- tfjax/research (the research
workflow), with tfjax/hf importing models into runs and tfjax/aot compiling runs' steps for absent
hardware. Within and across packages the module import graph has no cycle."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfjax")
# Which subpackages each layer may import (besides itself and the standard/third-party libraries).
ALLOWED = {"nn": set(), "runtime": {"nn"}, "data": {"nn", "runtime"},
           "inference": {"nn", "runtime", "data"},
           "training": {"nn", "runtime", "data", "inference", "modalities"},  # tfjax-params
           "research": {"nn", "runtime", "data", "inference", "training"},
           "hf": {"nn", "runtime", "data", "inference", "training"},
           "aot": {"nn", "runtime", "data", "inference", "training"},
           "modalities": {"nn"}}
# Modules that only alias another module under a spelling users (or configs/) import.
SHIMS = {"tfjax.ops", "tfjax.params"}


def imported_tfjax_modules(path):
  """Every tfjax.* module a file imports, at top level or inside functions."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names if a.name.startswith("tfjax"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfjax"):
      yield node.module
      # from tfjax import nn, training; from tfjax.training import data (maybe a module)
      yield from (f"{node.module}.{a.name}" for a in node.names)


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
      if module in SHIMS:  # the public shims are for users, not for the library
        wrong.append(f"{os.path.relpath(path, PACKAGE)} imports the shim {module}")
  assert not wrong, wrong


def test_the_checker_sees_a_violation(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from tfjax.training import train\n")
  assert list(imported_tfjax_modules(str(bad))) == ["tfjax.training", "tfjax.training.train"]


def test_public_spellings_are_the_same_modules():
  import tfjax.nn.ops  # pylint: disable=import-outside-toplevel
  import tfjax.ops  # pylint: disable=import-outside-toplevel
  import tfjax.params  # pylint: disable=import-outside-toplevel
  import tfjax.training.accounting.params  # pylint: disable=import-outside-toplevel
  import tfjax.training.params  # pylint: disable=import-outside-toplevel
  assert tfjax.ops is tfjax.nn.ops and tfjax.params is tfjax.training.accounting.params
  assert tfjax.training.params is tfjax.training.accounting.params
  assert callable(tfjax.ops.dot_product_attention)


def module_name(path, package=PACKAGE):
  rel = os.path.relpath(path, os.path.dirname(package))[:-len(".py")].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _without_type_checking_blocks(tree):
  """The module without its `if TYPE_CHECKING:` blocks: imports for annotations only, which
  never run and so cannot close a cycle."""
  class Strip(ast.NodeTransformer):
    def visit_If(self, node):  # pylint: disable=invalid-name
      test = node.test
      name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
      return node.orelse or None if name == "TYPE_CHECKING" else self.generic_visit(node)
  return Strip().visit(tree)


def old_spellings():
  """{old flat module name: the module it is now} of the packages split into subpackages
  (tfjax/runtime/module_aliases.py), so an import by an old spelling is still an edge."""
  import tfjax.hf  # pylint: disable=import-outside-toplevel
  import tfjax.training  # pylint: disable=import-outside-toplevel
  return {f"{package.__name__}.{name}": target for package in (tfjax.training, tfjax.hf)
          for name, target in package.ALIASES.items()}


def import_graph(package=PACKAGE, aliases=None):
  """{module: the tfjax modules it imports}, top-level and function-level imports alike; `from
  package import name` counts as importing the module package.name when that is a module, and an
  old spelling (`aliases`, default old_spellings()) counts as the module it names."""
  aliases = old_spellings() if aliases is None else aliases
  modules = {}
  for root, _, names in os.walk(package):
    for name in names:
      if name.endswith(".py"):
        modules[module_name(os.path.join(root, name), package)] = os.path.join(root, name)
  graph = {}
  for module, path in modules.items():
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    edges = set()
    for node in ast.walk(_without_type_checking_blocks(tree)):
      if isinstance(node, ast.Import):
        names = (aliases.get(a.name, a.name) for a in node.names)
        edges.update(n for n in names if n in modules)
      elif isinstance(node, ast.ImportFrom) and aliases.get(node.module, node.module) in modules:
        source = aliases.get(node.module, node.module)
        submodules = {aliases.get(f"{source}.{a.name}", f"{source}.{a.name}")
                      for a in node.names} & set(modules)
        edges.update(submodules or {source})
    edges.discard(module)
    graph[module] = edges - SHIMS if module not in SHIMS else edges
  return graph


def find_cycle(graph):
  """One import cycle as [m0, m1, ..., m0], or None (depth-first search, three colours)."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_module_import_graph_has_no_cycle():
  graph = import_graph()
  assert "tfjax.inference.decode" in graph and graph["tfjax.inference.decode"]  # it saw imports
  cycle = find_cycle(graph)
  assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_sees_a_cycle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert find_cycle(graph) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_function_level_imports(tmp_path):
  package = tmp_path / "tfjax"
  (package / "training").mkdir(parents=True)
  for name in ("__init__.py", "training/__init__.py"):
    (package / name).write_text("")
  (package / "training" / "a.py").write_text("from tfjax.training import b\n")
  (package / "training" / "b.py").write_text("def f():\n  from tfjax.training.a import g\n")
  graph = import_graph(str(package), aliases={})
  assert graph["tfjax.training.a"] == {"tfjax.training.b"}
  assert graph["tfjax.training.b"] == {"tfjax.training.a"}
  assert find_cycle(graph) == ["tfjax.training.a", "tfjax.training.b", "tfjax.training.a"]


def test_the_graph_follows_old_spellings(tmp_path):
  """`from tfjax.training import b` where b now lives in tfjax/training/loop/ is an edge to
  tfjax.training.loop.b, so a cycle through an old spelling is still found."""
  package = tmp_path / "tfjax"
  (package / "training" / "loop").mkdir(parents=True)
  for name in ("__init__.py", "training/__init__.py", "training/loop/__init__.py"):
    (package / name).write_text("")
  (package / "training" / "loop" / "a.py").write_text("from tfjax.training import b\n")
  (package / "training" / "loop" / "b.py").write_text("import tfjax.training.a\n")
  graph = import_graph(str(package), aliases={"tfjax.training.a": "tfjax.training.loop.a",
                                              "tfjax.training.b": "tfjax.training.loop.b"})
  assert graph["tfjax.training.loop.a"] == {"tfjax.training.loop.b"}
  assert graph["tfjax.training.loop.b"] == {"tfjax.training.loop.a"}
  assert find_cycle(graph) is not None


def test_no_library_module_is_over_450_lines():
  """Kernel files (tfjax/nn/kernels/) that are one concern may reach 500."""
  too_long = []
  for package in ("nn", "runtime", "data", "inference", "training"):
    for root, _, names in os.walk(os.path.join(PACKAGE, package)):
      for name in names:
        if name.endswith(".py"):
          path = os.path.join(root, name)
          limit = 500 if os.sep + "kernels" + os.sep in path else 450
          with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
          if lines > limit:
            too_long.append(f"{os.path.relpath(path, PACKAGE)}: {lines} > {limit}")
  assert not too_long, too_long


@pytest.mark.parametrize("old,new", [("decode", "tfjax.inference.decode"),
                                     ("prepared", "tfjax.data.prepared"),
                                     ("runtime", "tfjax.runtime.workarounds")])
def test_a_moved_module_names_its_new_home(old, new):
  import importlib  # pylint: disable=import-outside-toplevel
  with pytest.raises(ImportError, match=new.replace(".", r"\.")):
    importlib.import_module(f"tfjax.training.{old}")
  assert importlib.import_module(new).__name__ == new
