"""The rooms of tfjax/training and tfjax/hf (issue 58, build item 5): the flat folders hold only
their subpackages (and, for tfjax/hf, its core), and every old flat module spelling is still the
SAME module object as its new one (tfjax/runtime/module_aliases.py), so `import`, `from ... import`,
monkeypatching, `python -m` and the console-script targets keep working."""

import importlib
import os
import subprocess
import sys
import tomllib

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "tfjax")

# Written out here, not read from the packages' tables: the tables are what this checks.
TRAINING_ROOMS = {
    "loop": {"train", "steps", "experiment", "hooks", "cadence", "divergence", "metrics",
             "packed"},
    "checkpointing": {"checkpoint", "checkpoint_manifest", "runs", "init_from", "trees"},
    "config": {"defaults", "run_config"},
    "parallel": {"sharding", "memory_plan", "cpu_fusion"},
    "optim": {"optimizer", "losses"},
    "accounting": {"params", "flops"},
    "entry": {"main", "generate_main", "params_main", "cli"},
}
HF_MODELS = {"bart", "bert", "bigbird", "clip", "falcon", "funnel", "gemma3", "gpt2", "gpt_neox",
             "llama", "longformer", "opt", "phi", "phi3", "roberta", "t5", "vit", "whisper",
             "clip_vision"}
HF_CORE = {"__init__", "__main__", "importer", "exporter", "reader", "shards", "registry",
           "mapping", "modalities", "task_runs"}

OLD_TO_NEW = {f"tfjax.training.{name}": f"tfjax.training.{room}.{name}"
              for room, names in TRAINING_ROOMS.items() for name in names}
OLD_TO_NEW.update({f"tfjax.hf.{name}": f"tfjax.hf.models.{name}" for name in HF_MODELS})


def _python_files(folder):
  return {name[:-len(".py")] for name in os.listdir(folder) if name.endswith(".py")}


def _subpackages(folder):
  return {name for name in os.listdir(folder)
          if os.path.isfile(os.path.join(folder, name, "__init__.py"))}


def test_the_training_folder_holds_only_its_subpackages():
  folder = os.path.join(PACKAGE, "training")
  assert _python_files(folder) == {"__init__"}
  assert _subpackages(folder) == set(TRAINING_ROOMS) | {"tasks"}
  for room, names in TRAINING_ROOMS.items():
    assert _python_files(os.path.join(folder, room)) == names | {"__init__"}, room


def test_the_hf_folder_holds_its_core_and_the_model_mappings_apart():
  folder = os.path.join(PACKAGE, "hf")
  assert _python_files(folder) == HF_CORE
  assert _subpackages(folder) == {"models"}
  assert _python_files(os.path.join(folder, "models")) == HF_MODELS | {"__init__"}


# The entry points define absl flags, which one process defines once (other test files import
# some of them in this process): they are checked in a fresh process below.
IN_PROCESS = {old: new for old, new in OLD_TO_NEW.items() if ".entry." not in new}


@pytest.mark.parametrize("old,new", sorted(IN_PROCESS.items()))
def test_an_old_spelling_is_the_new_module(old, new):
  assert importlib.import_module(old) is importlib.import_module(new)
  module = sys.modules[old]
  assert module is sys.modules[new] and module.__name__ == new and module.__spec__.name == new
  package, _, name = old.rpartition(".")
  assert getattr(importlib.import_module(package), name) is module  # from package import name


def test_from_imports_and_monkeypatching_reach_the_code(monkeypatch):
  # pylint: disable=import-outside-toplevel
  from tfjax.hf import llama
  from tfjax.training import sharding
  from tfjax.hf.models import llama as new_llama
  from tfjax.training.parallel import sharding as new_sharding
  assert sharding is new_sharding and llama is new_llama
  sentinel = object()
  monkeypatch.setattr("tfjax.training.sharding.DEFAULT_RULES", sentinel)
  assert new_sharding.DEFAULT_RULES is sentinel


def test_an_old_spelling_first_in_a_fresh_process_is_still_one_module():
  """Old spellings imported before anything else (the other tests may have imported the new
  ones first), then every new one: one object each, each module executed once."""
  code = ("import importlib, sys, json; pairs = json.loads(sys.argv[1]);\n"
          "olds = [importlib.import_module(o) for o in pairs]\n"
          "news = [importlib.import_module(n) for n in pairs.values()]\n"
          "assert all(o is n for o, n in zip(olds, news)), 'two module objects'\n"
          "assert all(o.__name__ == o.__spec__.name == n for o, n in zip(olds, pairs.values()))\n"
          "import tfjax.training.cadence as c; importlib.reload(c)\n"
          "assert sys.modules['tfjax.training.loop.cadence'] is c is sys.modules["
          "'tfjax.training.cadence']\n"
          "print('ok', len(olds))")
  import json  # pylint: disable=import-outside-toplevel
  result = subprocess.run([sys.executable, "-c", code, json.dumps(OLD_TO_NEW)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["ok", str(len(OLD_TO_NEW))]


def test_python_dash_m_of_an_old_spelling_runs_the_entry_point(tmp_path):
  """`python -m tfjax.training.main` (documented for multi-host runs) ends a missing config in
  the entry point's one `error:` line, exit 2, as `python -m tfjax.training.entry.main` does."""
  for module in ("tfjax.training.main", "tfjax.training.entry.main"):
    result = subprocess.run([sys.executable, "-m", module, "--config=no_such_config.py",
                             f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 2, (module, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "no_such_config.py" in lines[-1], lines[-3:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script,old_target", [
    ("tfjax-train", "tfjax.training.main:run"),
    ("tfjax-generate", "tfjax.training.generate_main:run"),
    ("tfjax-params", "tfjax.training.params_main:main")])
def test_console_script_targets_resolve_new_and_old(script, old_target):
  """pyproject's [project.scripts] target and the old flat one (what an environment installed
  before the split still has in its bin/ script) name the same function. One process each:
  entry points define absl flags, which one process may define once."""
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    target = tomllib.load(f)["project"]["scripts"][script]
  assert target != old_target and target.startswith("tfjax.training.entry.")
  code = ("import importlib, sys\n"
          "def resolve(t):\n"
          "  module, _, attr = t.partition(':')\n"
          "  return getattr(importlib.import_module(module), attr)\n"
          "new, old = resolve(sys.argv[1]), resolve(sys.argv[2])\n"
          "assert callable(new) and new is old\n")
  result = subprocess.run([sys.executable, "-c", code, target, old_target], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]


def test_an_unknown_or_moved_name_still_fails_as_before():
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("tfjax.training.no_such_module")
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("tfjax.hf.no_such_model")
  with pytest.raises(ImportError, match=r"tfjax\.inference\.decode"):
    importlib.import_module("tfjax.training.decode")
