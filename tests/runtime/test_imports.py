"""tfjax/runtime/imports.py: --import of a module name or a .py file, recorded once each; a module
that cannot be imported is one ValueError naming it and the fix; a run's config.json imports the
modules it records before its keys are read, and names an unknown key with the --import hint."""

import json
import sys

import pytest

from tfjax.runtime import imports
from tfjax.training.config import run_config


@pytest.fixture
def fresh_imports(monkeypatch, tmp_path):
  """An empty record of imported modules and tmp_path on sys.path, both undone afterwards."""
  monkeypatch.setattr(imports, "_LOADED", [])
  monkeypatch.syspath_prepend(str(tmp_path))
  yield tmp_path
  for name in ("outside_mod", "outside_file", "outside_broken", "outside_needs"):
    sys.modules.pop(name, None)


def test_a_module_name_and_a_file_path_are_imported_and_recorded_once(fresh_imports):
  (fresh_imports / "outside_mod.py").write_text("COUNT = [0]\nCOUNT[0] += 1\n")
  folder = fresh_imports / "elsewhere"
  folder.mkdir()
  (folder / "outside_file.py").write_text("VALUE = 7\n")
  path = str(folder / "outside_file.py")
  assert imports.load(f"outside_mod,{path}") == ["outside_mod", path]
  assert imports.load(["outside_mod"]) == ["outside_mod"]  # already there: not imported again
  assert sys.modules["outside_mod"].COUNT == [1] and sys.modules["outside_file"].VALUE == 7
  assert imports.loaded() == ("outside_mod", path)


def test_from_argv_reads_both_spellings_and_commas():
  argv = ["prog", "--import=a,b", "--workdir=x", "--import", "c", "--import=", "--other=1"]
  assert imports.from_argv(argv) == ["a", "b", "c"]
  assert imports.flag_values(argv, "workdir") == ["x"]


@pytest.mark.parametrize("files,name,patterns", [
    ({}, "no_such_module_xyz", ["--import=no_such_module_xyz: no module named "
                                "'no_such_module_xyz'", "PYTHONPATH", "pip install"]),
    ({"outside_needs.py": "import not_installed_dep_xyz\n"}, "outside_needs",
     ["--import=outside_needs: the module imports 'not_installed_dep_xyz', which is not "
      "installed", "pip install"]),
    ({"outside_broken.py": "raise RuntimeError('boom')\n"}, "outside_broken",
     ["--import=outside_broken: importing the module failed: RuntimeError: boom"]),
    ({}, "missing/kind.py", ["--import=missing/kind.py: no such file"]),
])
def test_a_module_that_cannot_be_imported_is_one_error_naming_it_and_the_fix(
    fresh_imports, files, name, patterns):
  for file_name, text in files.items():
    (fresh_imports / file_name).write_text(text)
  with pytest.raises(ValueError) as info:
    imports.load(name)
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)
  assert imports.loaded() == ()


def test_a_run_imports_what_its_config_json_records_before_reading_its_keys(fresh_imports):
  (fresh_imports / "outside_mod.py").write_text("IMPORTED = True\n")
  run = fresh_imports / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"imports": ["outside_mod"], "seed": 3}))
  config = run_config.load_config(str(run))
  assert config.seed == 3 and sys.modules["outside_mod"].IMPORTED
  assert imports.loaded() == ("outside_mod",)


def test_an_unknown_key_of_a_run_names_the_key_and_the_import(fresh_imports):
  run = fresh_imports / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": {"sigmoid_bias": 1.0}}))
  with pytest.raises(ValueError) as info:
    run_config.load_config(str(run))
  message = str(info.value)
  for pattern in ("unknown config key model.sigmoid_bias in", "config.json",
                  "--import=MODULE", "the run records none"):
    assert pattern in message, message
  assert "unknown to this version" not in message
  (run / "config.json").write_text(json.dumps({"imports": ["no_such_module_xyz"]}))
  with pytest.raises(ValueError, match=r"config\.json records --import=no_such_module_xyz: no "
                                       r"module named"):
    run_config.load_config(str(run))
