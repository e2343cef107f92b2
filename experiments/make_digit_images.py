"""scikit-learn's bundled digits as an image folder for tfjax-prepare, with a fixed held-out split,
and the logistic-regression baseline on that split.

    pip install -e ".[vision]"            # Pillow, scikit-learn (the data ship inside it)
    python experiments/make_digit_images.py --output=data/digits [--seed=0] [--test_fraction=0.2] \
        [--baseline]
    tfjax-prepare --input=images:data/digits/train --val_input=images:data/digits/test \
        --image_size=32 --output=data/digits_prepared

The data: sklearn.datasets.load_digits(), 1,797 handwritten digits (UCI's optical recognition
set, test part), 8 x 8 pixels of ink counts 0-16. Each becomes an 8 x 8 grayscale PNG with
pixel round(count x 255 / 16) at OUTPUT/{train,test}/{digit}/{index:04d}.png, the index being
its row in load_digits (so any file traces back to its source row).

The split: for each digit class, np.random.default_rng(seed).permutation of that class's rows
(classes in order 0..9, one generator), the first round(--test_fraction x class size) rows to
test/, the rest to train/. With the defaults: 1,438 train / 359 test images, every class in
both. OUTPUT/split.json lists the test rows, the seed and the fraction.

--baseline: scikit-learn's LogisticRegression (lbfgs, C=1, max_iter=5000) on the PNGs' pixels
read back (the same 0-255 values a model reads from the prepared shards, scaled to [0, 1]),
trained on train/ and scored on test/; the accuracy is printed and written to baseline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _requires():
  try:
    from PIL import Image  # pylint: disable=import-outside-toplevel
    from sklearn import datasets  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    sys.exit(f"error: {e.name} is missing: pip install -e '.[vision]'")
  return Image, datasets


def split_rows(labels: np.ndarray, seed: int, test_fraction: float) -> np.ndarray:
  """The sorted rows of the test split (module docstring)."""
  rng = np.random.default_rng(seed)
  test = []
  for digit in range(10):
    rows = np.flatnonzero(labels == digit)
    test += list(rng.permutation(rows)[:round(test_fraction * len(rows))])
  return np.sort(np.asarray(test, np.int64))


def read_folder(folder: str):
  """(pixels [n, 64] float in [0, 1], labels [n]) of an image folder written here."""
  Image, _ = _requires()
  pixels, labels = [], []
  for digit in sorted(os.listdir(folder)):
    for name in sorted(os.listdir(os.path.join(folder, digit))):
      with Image.open(os.path.join(folder, digit, name)) as image:
        pixels.append(np.asarray(image, np.float64).reshape(-1) / 255.0)
      labels.append(int(digit))
  return np.stack(pixels), np.asarray(labels)


def baseline(output: str) -> dict:
  from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
  import sklearn  # pylint: disable=import-outside-toplevel
  x_train, y_train = read_folder(os.path.join(output, "train"))
  x_test, y_test = read_folder(os.path.join(output, "test"))
  model = LogisticRegression(C=1.0, max_iter=5000).fit(x_train, y_train)
  accuracy = float((model.predict(x_test) == y_test).mean())
  return {"model": "sklearn LogisticRegression(C=1.0, max_iter=5000), lbfgs, pixels / 255",
          "sklearn": sklearn.__version__, "train": len(y_train), "test": len(y_test),
          "test_accuracy": accuracy}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--output", required=True, help="the folder to write (train/ and test/ inside)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--test_fraction", type=float, default=0.2)
  p.add_argument("--baseline", action="store_true",
                 help="also fit and score the logistic-regression baseline")
  args = p.parse_args(argv)
  Image, datasets = _requires()
  if not 0.0 < args.test_fraction < 1.0:
    sys.exit(f"error: --test_fraction={args.test_fraction}: must be in (0, 1)")
  if os.path.exists(args.output) and os.listdir(args.output):
    sys.exit(f"error: --output={args.output} is not empty; choose a new folder")
  digits = datasets.load_digits()
  images = np.rint(digits.images * 255.0 / 16.0).astype(np.uint8)  # ink counts 0-16 -> 0-255
  test_rows = split_rows(digits.target, args.seed, args.test_fraction)
  in_test = np.zeros(len(images), bool)
  in_test[test_rows] = True
  for row, (image, digit) in enumerate(zip(images, digits.target)):
    folder = os.path.join(args.output, "test" if in_test[row] else "train", str(digit))
    os.makedirs(folder, exist_ok=True)
    Image.fromarray(image, mode="L").save(os.path.join(folder, f"{row:04d}.png"))
  with open(os.path.join(args.output, "split.json"), "w", encoding="utf-8") as f:
    json.dump({"made_by": "experiments/make_digit_images.py", "source":
               "sklearn.datasets.load_digits", "seed": args.seed,
               "test_fraction": args.test_fraction, "train": int((~in_test).sum()),
               "test": int(in_test.sum()), "test_rows": test_rows.tolist()}, f)
  print(f"{args.output}: {int((~in_test).sum())} train / {int(in_test.sum())} test images "
        "(8 x 8 grayscale PNG)")
  if args.baseline:
    result = baseline(args.output)
    with open(os.path.join(args.output, "baseline.json"), "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
    print(f"logistic regression: test accuracy {result['test_accuracy']:.4f} "
          f"({result['test']} images, scikit-learn {result['sklearn']})")


if __name__ == "__main__":
  main()
