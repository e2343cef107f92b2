"""ViT on scikit-learn's digits beside scikit-learn's logistic regression, on the same fixed
held-out split, in one run on one machine (issue 58 item 3; docs/modalities.md).

  python experiments/make_digit_images.py --output=data/digits
  tfjax-prepare --input=images:data/digits/train --val_input=images:data/digits/test \\
      --image_size=8 --image_mode=L --output=data/digits_8px
  python experiments/bench_digits.py --prepared=data/digits_8px --workdir=runs/vit_digits

Trains configs/vit_digits.py through experiments/train.py (a finished --workdir is reused),
scores the newest checkpoint on every held-out image (argmax of the class logits), and fits
LogisticRegression(C=1, lbfgs, max_iter=5000) on the same prepared pixels / 255. The digits are
1,797 8x8 scans of handwriting (UCI, bundled with scikit-learn); the split is
make_digit_images.py's (seed 0, 20% of each class held out: 1,438 / 359). Writes
OUT/bench_digits.json and .md.
"""

from __future__ import annotations

import sys
import time

import ml_collections
import numpy as np

import media_bench  # experiments/media_bench.py (its ROOT on sys.path first)


def logistic_regression(train, held_out) -> dict:
  from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
  import sklearn  # pylint: disable=import-outside-toplevel

  def xy(split):
    rows = np.arange(len(split))
    return split.pixels(rows).reshape(len(split), -1) / 255.0, split.labels(rows)
  start = time.perf_counter()
  model = LogisticRegression(C=1.0, max_iter=5000).fit(*xy(train))
  x, y = xy(held_out)
  return {"accuracy": float((model.predict(x) == y).mean()), "seconds": time.perf_counter() - start,
          "model": f"sklearn {sklearn.__version__} LogisticRegression(C=1.0, max_iter=5000), "
                   "lbfgs, pixels / 255"}


def vit_accuracy(workdir: str) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.nn.vision import ViTClassifier  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.tasks.vit import scaled_pixels  # pylint: disable=import-outside-toplevel

  run = runs.restore_run(workdir)
  held_out = run.dataset.held_out
  rows = np.arange(len(held_out))
  logits = jax.jit(lambda p, x: ViTClassifier(run.model_config).apply({"params": p}, x)[
      "logits"])(run.params, scaled_pixels(held_out.pixels(rows)))
  right = np.asarray(np.argmax(logits, -1)) == held_out.labels(rows)
  return {"accuracy": float(right.mean()), "correct": int(right.sum()), "images": len(rows),
          "step": run.step}


def main(argv=None) -> None:
  args, was_there, seconds = media_bench.parse_and_train(
      argv, __doc__.split("\n")[0], "tfjax-prepare's output (8px L digits)", "configs/vit_digits.py")
  vit = vit_accuracy(args.workdir)
  rows = media_bench.metrics(args.workdir)
  from tfjax.training.tasks.prepared_rows import open_prepared
  train, held_out = open_prepared(ml_collections.ConfigDict(
      {"data": {"path": args.prepared, "verify": "checksum"}}), "image", "image_folder")
  baseline = logistic_regression(train, held_out)
  result = {"command": "python experiments/bench_digits.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "stamp": media_bench.stamp(), "seed": args.seed, "config": args.config,
            "train_images": len(train), "test_images": len(held_out),
            "train_seconds": None if was_there else seconds,
            "reused_run": was_there,
            "vit": vit, "logistic_regression": baseline,
            "eval_accuracy_curve": media_bench.curve(rows, "eval/accuracy")}
  took = "run reused, not timed here" if was_there else f"{seconds:.0f} s"
  table = ["| model (same split, same machine) | test accuracy (359 images) | time |",
           "| --- | --- | --- |",
           f"| ViT, {args.config}, step {vit['step']}, seed {args.seed} | "
           f"{vit['accuracy']:.4f} ({vit['correct']}/{vit['images']}) | {took} train |",
           f"| {baseline['model']} | {baseline['accuracy']:.4f} | {baseline['seconds']:.1f} s |",
           "", "ViT eval/accuracy by step: " + ", ".join(
               f"{s}: {a:.3f}" for s, a in result["eval_accuracy_curve"])]
  media_bench.write(args.out, "bench_digits", result, table)


if __name__ == "__main__":
  main()
