"""`tfjax-generate` / experiments/generate.py: restores the newest checkpoint of --workdir and
continues a prompt.

  python experiments/generate.py --workdir=runs/shakespeare --prompt="ROMEO:" --max_new_tokens=200
  python experiments/generate.py --workdir=DIR --prompt="First" --strategy=sample --top_p=0.9 \
      --num_samples=3 --seed=1
  python experiments/generate.py --workdir=DIR --prompt="^abc|" --strategy=beam --beam_size=4
  python experiments/generate.py --workdir=WHISPER_RUN --audio=clip.wav [--strategy=beam]

A Whisper run (config.task='whisper') transcribes --audio / --features instead of continuing a
prompt (tfjax/inference/transcribe.py: the run's generation_config.json sets the prompt tokens,
suppress lists and beam length penalty, as transformers' generate reads them).

The run's own config.json (and the --import modules it records), tokenizer and newest readable
checkpoint are used; how --prompt is read is tfjax/inference/generate.py. --prompt_ids="1 4 5"
gives raw ids instead. Any --max_new_tokens works: past the model's max_len the context slides
(tfjax/inference/decode_window.py). A bad flag, workdir or prompt ends in one `error:` line
(tfjax/training/entry/cli.py).
"""

from __future__ import annotations

import logging
import os
import sys

from tfjax.inference import decode
from tfjax.inference.generate import generate_for_run
from tfjax.inference.transcribe import transcribe_for_run
from tfjax.runtime import imports
from tfjax.training.checkpointing import runs
from tfjax.training.entry import cli
from tfjax.training.loop.metrics import setup_logging


def parse_args(argv):
  parser = cli.ArgumentParser(
      prog="tfjax-generate",
      description="Continue a prompt with a trained run's newest checkpoint.")
  parser.add_argument("--workdir", required=True, help="a training run directory")
  parser.add_argument("--prompt", default="", help="text in the run's tokenizer / alphabet")
  parser.add_argument("--prompt_ids", default=None, help="raw token ids, e.g. '1 4 5' (overrides)")
  parser.add_argument("--strategy", default="greedy", choices=decode.STRATEGIES,
                      help="greedy | sample (temperature, top_k, top_p) | beam")
  parser.add_argument("--max_new_tokens", type=int, default=100, help="tokens to generate")
  parser.add_argument("--num_samples", type=int, default=1,
                      help="samples per prompt (sample) or hypotheses shown (beam)")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed")
  parser.add_argument("--temperature", type=float, default=1.0, help="sample: logits / T")
  parser.add_argument("--top_k", type=int, default=None, help="sample: keep the k likeliest")
  parser.add_argument("--top_p", type=float, default=None, help="sample: nucleus mass p")
  parser.add_argument("--beam_size", type=int, default=4, help="beam: beams per prompt")
  parser.add_argument("--length_penalty", type=float, default=None,
                      help="beam: GNMT length penalty alpha (default 0.6; Whisper: "
                           "transformers' log-prob / length ** penalty, default the generation "
                           "config's, else 1.0)")
  parser.add_argument("--eos_id", type=int, default=None,
                      help="stop token (default: EOS of synthetic tasks, none for text; -1 = none)")
  whisper = parser.add_argument_group("Whisper runs (transcription)")
  whisper.add_argument("--audio", default=None, help="WAV file(s), comma-separated (16 kHz mono)")
  whisper.add_argument("--features", default=None,
                       help="log-mel features .npy, [frames, mels] or [batch, frames, mels]")
  whisper.add_argument("--language", default=None,
                       help="language code (en, de, ...) of a multilingual model; default: the "
                            "generation config's forced one, else detected")
  whisper.add_argument("--whisper_task", default=None, choices=("transcribe", "translate"),
                       help="default: the generation config's forced task")
  cli.add_import_argument(parser)
  return parser.parse_args(argv)


def generate_from_run(args) -> list[dict]:
  """Restores the newest checkpoint of args.workdir and continues the prompt
  (`generate_for_run`), or transcribes (a Whisper run: `transcribe_for_run`)."""
  run = runs.restore_run(args.workdir)
  if run.config.task == "whisper":
    return transcribe_for_run(run, args, os.path.join(run.workdir, runs.ORIGIN_DIR))
  for flag in ("audio", "features", "language", "whisper_task"):
    if getattr(args, flag, None) is not None:
      raise ValueError(f"--{flag} is for Whisper runs; {args.workdir} trains task "
                       f"{run.config.task!r}")
  return generate_for_run(run, args)


@cli.guarded  # configuration / workdir / prompt problems: one `error:` line, exit 2
def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  imports.load(args.imports)  # the run's own (config.json) are imported when it is read
  if not os.path.isdir(args.workdir):
    raise ValueError(f"--workdir={args.workdir}: no such directory (give a training run's "
                     "--workdir)")
  results = generate_from_run(args)
  score_name = "score (log-prob / GNMT penalty)" if args.strategy == "beam" else "log-prob"
  for i, r in enumerate(results):
    print(f"--- {i} | checkpoint step {r['step']} | {score_name} {r['score']:.3f}")
    print(r["text"])
  return results


def run():
  """The `tfjax-generate` console script."""
  setup_logging()  # orbax logs every file it touches at INFO
  logging.getLogger("tfjax").setLevel(logging.WARNING)  # the output is the text, nothing else
  main()


if __name__ == "__main__":
  run()
