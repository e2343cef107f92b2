"""tfjax/runtime/files.py: atomic writes never leave half a file or lose the old one."""

import os

import pytest

from tfjax.runtime import files


def test_json_round_trip_and_replace(tmp_path):
  path = str(tmp_path / "a.json")
  files.write_json_atomic(path, {"x": [1, 2]})
  files.write_json_atomic(path, {"x": "é"}, indent=1)
  assert files.read_json(path) == {"x": "é"}
  assert os.listdir(tmp_path) == ["a.json"]


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "a.txt")
  with files.replaced_atomically(path) as f:
    f.write("old")
  with pytest.raises(RuntimeError):
    with files.replaced_atomically(path) as f:
      f.write("half of the new")
      raise RuntimeError("crash mid-write")
  with open(path, encoding="utf-8") as f:
    assert f.read() == "old"
  assert os.listdir(tmp_path) == ["a.txt"]


def test_unserializable_json_keeps_the_old_file(tmp_path):
  path = str(tmp_path / "a.json")
  files.write_json_atomic(path, {"ok": 1})
  with pytest.raises(TypeError):
    files.write_json_atomic(path, {"bad": object()})
  assert files.read_json(path) == {"ok": 1}
