"""The synthetic recipes of ViT, CLIP, Whisper and Funnel through the main loop, in one table
(docs/modalities.md, docs/attention/funnel.md).

  python experiments/bench_synthetic_tasks.py --root=runs/synthetic [--names=vit,clip]

Runs `python experiments/train.py --config=configs/NAME.py --workdir=ROOT/NAME` for each recipe
(an existing workdir is removed first, so every number comes from a fresh run: the timing
includes start-up and compiles), then reads metrics.jsonl: the step-0 evaluation (untrained),
the last logged training loss and the final evaluation. Writes OUT/bench_synthetic_tasks.json
and .md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import media_bench  # experiments/media_bench.py (its ROOT on sys.path first)

RECIPES = {"vit": "configs/vit_synthetic.py", "clip": "configs/clip_synthetic.py",
           "whisper": "configs/whisper_synthetic.py", "funnel": "configs/funnel_synthetic.py",
           "funnel_classify": "configs/funnel_synthetic.py:classify"}
SHOWN = ("eval/loss", "eval/accuracy", "eval/class_accuracy", "eval/exact_match")


def measure(name: str, config: str, root: str) -> dict:
  workdir = os.path.join(root, name)
  shutil.rmtree(workdir, ignore_errors=True)
  seconds = media_bench.train(config, workdir, [])
  rows = media_bench.metrics(workdir)
  evals = [row for row in rows if "eval/loss" in row]
  trains = [row for row in rows if "train/loss" in row]
  return {"config": config, "steps": rows[-1]["step"], "seconds": seconds,
          "init_eval": {k: v for k, v in evals[0].items() if k.startswith("eval/")},
          "final_eval": {k: v for k, v in evals[-1].items() if k.startswith("eval/")},
          "final_train_loss": trains[-1]["train/loss"], "final_train_step": trains[-1]["step"]}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", required=True, help="the runs go to ROOT/NAME (replaced)")
  parser.add_argument("--names", default=",".join(RECIPES))
  parser.add_argument("--out", default="bench_results")
  args = parser.parse_args(argv)
  results = {name: measure(name, RECIPES[name], args.root) for name in args.names.split(",")}
  result = {"command": "python experiments/bench_synthetic_tasks.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "stamp": media_bench.stamp(), "seed": 0, "runs": results}

  def shown(values):
    return ", ".join(f"{k[5:]} {values[k]:.4f}" for k in SHOWN if k in values)
  table = ["| config | steps | eval at init | final train loss | final eval | seconds (command) |",
           "| --- | --- | --- | --- | --- | --- |"]
  table += [f"| {r['config']} | {r['steps']} | {shown(r['init_eval'])} | "
            f"{r['final_train_loss']:.4f} (step {r['final_train_step']}) | "
            f"{shown(r['final_eval'])} | {r['seconds']:.0f} |" for r in results.values()]
  media_bench.write(args.out, "bench_synthetic_tasks", result, table)


if __name__ == "__main__":
  main()
