"""The library's lines are at most 100 columns (the project's standard)."""

import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfjax")
MAX_COLUMNS = 100


def long_lines(root: str, skip=()) -> list:
  """'path:line: N columns' of every .py line under `root` over MAX_COLUMNS (`skip`: folders
  directly under `root` to leave out)."""
  found = []
  for folder, dirs, names in os.walk(root):
    if folder == root:
      dirs[:] = [d for d in dirs if d not in skip]
    for name in sorted(names):
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
          columns = len(line.rstrip("\r\n"))
          if columns > MAX_COLUMNS:
            found.append(f"{os.path.relpath(path, root)}:{number}: {columns} columns")
  return found


def test_no_library_line_is_over_100_columns():
  assert long_lines(PACKAGE) == []


def test_the_checker_sees_a_long_line(tmp_path):
  (tmp_path / "ok.py").write_text("x" * MAX_COLUMNS + "\n")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "long.py").write_text("# short\n" + "y" * (MAX_COLUMNS + 1) + "\n")
  (tmp_path / "skipped").mkdir()
  (tmp_path / "skipped" / "long.py").write_text("z" * (MAX_COLUMNS + 5) + "\n")
  assert long_lines(str(tmp_path), skip=("skipped",)) == [
      f"{os.path.join('sub', 'long.py')}:2: {MAX_COLUMNS + 1} columns"]
