"""docs/data.md's "Image and audio folders" commands, run as written from a scratch directory
(installs skipped; the spoken-digit set cut to a few clips): the digits image folder, its split
and baseline, espeak-ng's spoken digits, and both prepares."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTION = "Image and audio folders"
SIZE_FLAGS = {"experiments/make_spoken_digits.py": ["--train_clips=6", "--test_clips=3"]}


def documented_commands() -> list[str]:
  with open(os.path.join(REPO, "docs", "data.md"), encoding="utf-8") as f:
    text = f.read()
  for section in re.split(r"^## ", text, flags=re.M)[1:]:
    title, _, body = section.partition("\n")
    if title.strip() == SECTION:
      lines = re.findall(r"```bash\n(.*?)```", body, flags=re.S)[0].splitlines()
      return [" ".join(re.sub(r"(^|\s)#.*$", "", line).split()) for line in lines
              if line.strip() and not line.startswith(("pip ", "apt-get "))]
  raise AssertionError(f"docs/data.md has no section {SECTION!r}")


def _run(command: str, cwd) -> str:
  argv = shlex.split(command)
  if argv[0] == "python":
    argv = [sys.executable, os.path.join(REPO, argv[1])] + argv[2:] + SIZE_FLAGS.get(argv[1], [])
  elif argv[0] == "tfjax-prepare":
    argv = [sys.executable, "-m", "tfjax.data.prepare"] + argv[1:] + ["--progress=false"]
  env = dict(os.environ, PYTHONPATH=REPO)
  done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
  return done.stdout


def test_documented_commands_are_these():
  commands = documented_commands()
  assert len(commands) == 4 and [c.split()[0] for c in commands] == [
      "python", "tfjax-prepare", "python", "tfjax-prepare"], commands


def test_digit_images_commands(tmp_path):
  pytest.importorskip("PIL")
  sklearn = pytest.importorskip("sklearn.datasets")
  make, prepare = documented_commands()[:2]
  out = _run(make, tmp_path)
  assert "1438 train / 359 test images" in out
  assert re.search(r"logistic regression: test accuracy 0\.9[0-9]{3}", out), out
  split = json.loads((tmp_path / "data/digits/split.json").read_text())
  digits = sklearn.load_digits()
  test_rows = np.asarray(split["test_rows"])
  assert len(test_rows) == 359 and len(set(test_rows.tolist())) == 359
  for digit in range(10):  # every class in both splits, about 20% held out
    in_class = int((digits.target == digit).sum())
    assert int((digits.target[test_rows] == digit).sum()) == round(0.2 * in_class)
  assert "image train 1,438 examples" in _run(prepare, tmp_path)
  from tfjax.data import prepared_media
  val = prepared_media.open_split(str(tmp_path / "data/digits_prepared"), "val", kind="image")
  assert val.class_names == [str(d) for d in range(10)] and len(val) == 359
  # val row 0 is test row test_rows[0] of class 0 (classes, then file names, in sorted order)
  first = min(r for r in test_rows if digits.target[r] == 0)
  assert val.labels([0])[0] == 0
  pixels = val.pixels([0])[0]
  assert pixels.shape == (32, 32, 3) and np.all(pixels[..., 0] == pixels[..., 2])
  # an 8 x 8 image upsampled 4x: its mean brightness stays close to the source's
  source = np.rint(digits.images[first] * 255 / 16)
  assert abs(pixels[..., 0].mean() - source.mean()) < 6


def test_spoken_digits_commands(tmp_path):
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
  pytest.importorskip("scipy.signal")
  make, prepare = documented_commands()[2:]
  assert "6 train + 3 test clips" in _run(make, tmp_path)
  about = json.loads((tmp_path / "data/spoken_digits/about.json").read_text())
  assert about["sample_rate"] == 16000 and about["seed"] == 0
  first = (tmp_path / "data/spoken_digits/train/00000.wav").read_bytes()
  again = tmp_path / "again"
  _run(make.replace("data/spoken_digits", "again"), tmp_path)
  assert again.joinpath("train/00000.wav").read_bytes() == first  # deterministic for a seed
  assert "audio train 6 examples" in _run(prepare, tmp_path)
  from tfjax.data import prepared_media
  val = prepared_media.open_split(str(tmp_path / "data/spoken_digits_prepared"), "val",
                                  kind="audio")
  words = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
  for i in range(len(val)):
    assert set(val.text(i).split()) <= words
    assert val.features([i]).shape == (1, 3000, 80)
