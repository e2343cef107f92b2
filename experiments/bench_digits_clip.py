"""CLIP zero-shot accuracy on scikit-learn's held-out digits with caption templates (issue 58
item 3; docs/modalities.md).

  python experiments/make_digit_images.py --output=data/digits
  tfjax-prepare --input=images:data/digits/train --val_input=images:data/digits/test \\
      --image_size=8 --image_mode=L --output=data/digits_8px
  python experiments/bench_digits_clip.py --prepared=data/digits_8px --workdir=runs/clip_digits

Trains configs/clip_digits.py through experiments/train.py (contrastive, train-split images with
captions of their class under the config's templates; a finished --workdir is reused), then
classifies every held-out image zero-shot from the newest checkpoint: the class whose caption
embedding is nearest, with each template alone and with their mean (the prompt ensemble). The
untrained floor is the same run's step-0 evaluation (eval/zero_shot_accuracy at init); chance is
1 / 10. Writes OUT/bench_digits_clip.json and .md.
"""

from __future__ import annotations

import sys

import numpy as np

import media_bench  # experiments/media_bench.py (its ROOT on sys.path first)


def zero_shot(workdir: str) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.nn.clip import CLIP  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.tasks.vit import scaled_pixels  # pylint: disable=import-outside-toplevel

  run = runs.restore_run(workdir)
  dataset = run.dataset
  held_out, vocab = dataset.held_out, dataset.vocabulary
  rows = np.arange(len(held_out))
  model = CLIP(run.model_config)
  image_NxP = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x,
                                                          method=CLIP.encode_image))(
      run.params, scaled_pixels(held_out.pixels(rows))))
  captions_CxTxL = vocab.captions_CxTxL
  classes, templates, length = captions_CxTxL.shape
  text_CxTxP = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t,
                                                           method=CLIP.encode_text))(
      run.params, captions_CxTxL.reshape(-1, length))).reshape(classes, templates, -1)
  labels = held_out.labels(rows)

  def accuracy(class_CxP):
    class_CxP = class_CxP / np.linalg.norm(class_CxP, axis=-1, keepdims=True)
    return float((np.argmax(image_NxP @ class_CxP.T, -1) == labels).mean())
  return {"step": run.step, "images": len(rows),
          "ensemble": accuracy(text_CxTxP.mean(axis=1)),
          "per_template": {t: accuracy(text_CxTxP[:, i]) for i, t in enumerate(vocab.templates)}}


def main(argv=None) -> None:
  args, was_there, seconds = media_bench.parse_and_train(
      argv, __doc__.split("\n")[0], "tfjax-prepare's output (8px L digits)", "configs/clip_digits.py")
  trained = zero_shot(args.workdir)
  rows = media_bench.metrics(args.workdir)
  loop_curve = media_bench.curve(rows, "eval/zero_shot_accuracy")
  floor = dict(loop_curve)[0]
  result = {"command": "python experiments/bench_digits_clip.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "stamp": media_bench.stamp(), "seed": args.seed, "config": args.config,
            "train_seconds": None if was_there else seconds,
            "reused_run": was_there, "trained": trained, "untrained_floor": floor,
            "chance": 0.1, "zero_shot_curve": loop_curve,
            "class_retrieval_curve": media_bench.curve(rows, "eval/class_accuracy")}
  took = "run reused, not timed here" if was_there else f"{seconds:.0f} s"
  table = ["| CLIP on the 359 held-out digits | zero-shot accuracy |", "| --- | --- |",
           f"| trained ({args.config}, step {trained['step']}, seed {args.seed}, "
           f"{took}), prompt ensemble of the {len(trained['per_template'])} templates | "
           f"{trained['ensemble']:.4f} |"]
  table += [f"| trained, template \"{t}\" alone | {a:.4f} |"
            for t, a in trained["per_template"].items()]
  table += [f"| untrained (the run's step-0 weights), prompt ensemble | {floor:.4f} |",
            "| chance (10 classes) | 0.1000 |", "",
            "eval/zero_shot_accuracy by step (the loop's eval): " + ", ".join(
                f"{s}: {a:.3f}" for s, a in loop_curve)]
  media_bench.write(args.out, "bench_digits_clip", result, table)


if __name__ == "__main__":
  main()
