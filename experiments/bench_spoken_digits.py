"""Word error rate of a tiny Whisper trained on spoken digit strings, greedy decoding on the
200 held-out clips (issue 58 item 3; docs/modalities.md).

  python experiments/make_spoken_digits.py --output=data/spoken_digits   # espeak-ng, offline
  tfjax-prepare --input=audio:data/spoken_digits/train \\
      --val_input=audio:data/spoken_digits/test --tokenizer=char \\
      --output=data/spoken_digits_prepared
  python experiments/bench_spoken_digits.py --prepared=data/spoken_digits_prepared \\
      --workdir=runs/whisper_digits

The clips: experiments/make_spoken_digits.py has espeak-ng 1.51 speak strings of 1-7 digit
words ("three one four") in four English voices at 130-190 words per minute and pitch 30-70
(drawn per clip from its --seed), resampled to 16 kHz: 1,000 train / 200 test clips, no
speaker or string shared on purpose (strings are drawn independently). Trains
configs/whisper_spoken_digits.py through experiments/train.py (a finished --workdir is reused),
greedy-decodes every held-out clip from the newest checkpoint (tfjax.nn.audio.greedy_decode,
no suppression lists: the vocabulary is the tokenizer's characters) and scores the words
against the transcripts with tfjax.inference.wer. Writes OUT/bench_spoken_digits.json and .md
(with the loop's teacher-forced curve).
"""

from __future__ import annotations

import sys

import numpy as np

import media_bench  # experiments/media_bench.py (its ROOT on sys.path first)


def greedy_wer(workdir: str, batch: int = 40) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.data.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  from tfjax.inference.wer import word_error_rate  # pylint: disable=import-outside-toplevel
  from tfjax.nn.audio import greedy_decode  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.tasks.whisper import transcripts  # pylint: disable=import-outside-toplevel

  run = runs.restore_run(workdir)
  cfg = run.model_config
  held_out = run.dataset.held_out
  tokenizer = load_tokenizer(run.config.data.path)
  decode = jax.jit(lambda p, f: greedy_decode(cfg, p, f, cfg.max_target_positions - 1))
  references, hypotheses = [], []
  for start in range(0, len(held_out), batch):
    rows = np.arange(start, min(start + batch, len(held_out)))
    features = held_out.features(rows)[:, :cfg.num_frames]
    hypotheses += transcripts(decode(run.params, features), tokenizer)
    references += [held_out.text(int(i)) for i in rows]
  score = word_error_rate(references, hypotheses)
  examples = [{"reference": r, "hypothesis": h} for r, h in zip(references[:8], hypotheses[:8])]
  return {"step": run.step, **score, "examples": examples}


def main(argv=None) -> None:
  args, was_there, seconds = media_bench.parse_and_train(
      argv, __doc__.split("\n")[0], "tfjax-prepare's output (audio, char)", "configs/whisper_spoken_digits.py")
  score = greedy_wer(args.workdir)
  rows = media_bench.metrics(args.workdir)
  result = {"command": "python experiments/bench_spoken_digits.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "stamp": media_bench.stamp(), "seed": args.seed, "config": args.config,
            "train_seconds": None if was_there else seconds,
            "reused_run": was_there, "greedy": score,
            "exact_match_curve": media_bench.curve(rows, "eval/exact_match"),
            "eval_loss_curve": media_bench.curve(rows, "eval/loss"),
            "train_loss_curve": media_bench.curve(rows, "train/loss")}
  took = "run reused, not timed here" if was_there else f"{seconds:.0f} s"
  table = ["| tiny Whisper, 200 held-out clips | value |", "| --- | --- |",
           f"| word error rate, greedy ({score['errors']} edits / {score['words']} words) | "
           f"{score['wer']:.4f} |",
           f"| clips with any error | {score['sentence_errors']} / {score['sentences']} |",
           f"| training: {args.config}, step {score['step']}, seed {args.seed} | {took} |",
           "", "Teacher-forced eval by step (exact match = greedy exact match; loss per token): "
           + ", ".join(f"{s}: {e:.3f} / {l:.3f}" for (s, e), (_, l) in zip(
               result["exact_match_curve"], result["eval_loss_curve"])),
           "", "First test clips (reference -> greedy hypothesis): " + "; ".join(
               f"\"{e['reference']}\" -> \"{e['hypothesis']}\"" for e in score["examples"][:4])]
  media_bench.write(args.out, "bench_spoken_digits", result, table)


if __name__ == "__main__":
  main()
