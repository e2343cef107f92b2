"""`tfjax-generate` / experiments/generate.py: restores the newest checkpoint of --workdir and
continues a prompt.

  python experiments/generate.py --workdir=runs/shakespeare --prompt="ROMEO:" --max_new_tokens=200
  python experiments/generate.py --workdir=DIR --prompt="First" --strategy=sample --top_p=0.9 \
      --num_samples=3 --seed=1
  python experiments/generate.py --workdir=DIR --prompt="^abc|" --strategy=beam --beam_size=4

The run's own config.json, tokenizer and newest readable checkpoint are used. Text datasets encode
--prompt with the run's tokenizer (read from the workdir, so a run imported from Hugging Face,
which has no corpus, generates too: `python -m tfjax.hf import`, docs/hf.md; its EOS stops
generation and its decoder start token begins a seq2seq output). Synthetic tasks read it in their
display alphabet ('^' BOS,
'|' SEP, '$' EOS, symbols as letters), so a copy-task LM is prompted with "^abc|"; a seq2seq model
takes the bare source ("abc") and decodes from [BOS]. --prompt_ids="1 4 5" gives raw ids instead.
Any --max_new_tokens works: past the model's max_len the context slides (tfjax/training/
decode_window.py). A bad flag, workdir or prompt ends in one `error:` line (tfjax/training/cli.py).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

import numpy as np

from tfjax.training import cli, decode, runs, synthetic, tokenizers


def parse_args(argv):
  parser = cli.ArgumentParser(prog="tfjax-generate",
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
  parser.add_argument("--length_penalty", type=float, default=0.6,
                      help="beam: GNMT length penalty alpha")
  parser.add_argument("--eos_id", type=int, default=None,
                      help="stop token (default: EOS of synthetic tasks, none for text; -1 = none)")
  return parser.parse_args(argv)


def _display_alphabet(dataset) -> dict:
  """Synthetic datasets show ids as short strings; this inverts `dataset.decode`."""
  return {dataset.decode([i], skip_pad=False): i for i in range(dataset.vocab_size)}


def encode_prompt(dataset, text: str) -> list[int]:
  tokenizer = getattr(dataset, "tokenizer", None)
  if tokenizer is not None:
    return [int(i) for i in tokenizer.encode(text)]
  alphabet = _display_alphabet(dataset)
  ids, i = [], 0
  longest = max(len(s) for s in alphabet)
  while i < len(text):  # longest match: symbols past 'Z' display as '<52>'
    for size in range(min(longest, len(text) - i), 0, -1):
      if text[i:i + size] in alphabet:
        ids.append(alphabet[text[i:i + size]])
        i += size
        break
    else:
      raise ValueError(f"{text[i]!r} is not in this task's alphabet {sorted(alphabet)}")
  return ids


def decode_ids(dataset, ids) -> str:
  tokenizer = getattr(dataset, "tokenizer", None)
  return tokenizer.decode(ids) if tokenizer is not None else dataset.decode(ids)


class _SavedTokenizer:
  """The run's saved tokenizer standing in for its dataset (encode/decode only)."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer


def _text_codec(run):
  """The workdir's tokenizer if it holds one (no corpus needed), else the run's dataset."""
  if run.config.data.name in synthetic.TASKS:
    return run.dataset
  if os.path.exists(os.path.join(run.workdir, tokenizers.TOKENIZER_FILE)):
    return _SavedTokenizer(tokenizers.load_tokenizer(run.workdir))
  return run.dataset


def generate_from_run(args) -> list[dict]:
  run = runs.restore_run(args.workdir)
  cfg, task, step, params = run.model_config, run.config.task, run.step, run.params
  dataset = _text_codec(run)
  special = getattr(getattr(dataset, "tokenizer", None), "special", {})
  if task not in ("lm", "seq2seq"):
    raise ValueError(f"run {args.workdir} trains task {task!r}; only 'lm' and 'seq2seq' generate")
  ids = ([int(t) for t in args.prompt_ids.replace(",", " ").split()] if args.prompt_ids is not None
         else encode_prompt(dataset, args.prompt))
  eos_id: Optional[int] = args.eos_id
  if eos_id is None and isinstance(dataset, synthetic.SyntheticDataset):
    eos_id = synthetic.EOS
  if eos_id is None:
    eos_id = special.get("eos_id")
  eos_id = None if eos_id is not None and eos_id < 0 else eos_id
  if task == "seq2seq":
    start = special.get("decoder_start_id")
    prompt, encoder_inputs = [[synthetic.BOS if start is None else start]], [ids]
  else:
    if not ids:
      raise ValueError("an LM needs a non-empty prompt (--prompt or --prompt_ids)")
    prompt, encoder_inputs = [ids], None
  out = decode.generate(
      cfg, params, prompt, max_new_tokens=args.max_new_tokens, strategy=args.strategy,
      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
      num_samples=args.num_samples, beam_size=args.beam_size,
      length_penalty=args.length_penalty, eos_id=eos_id, rng=args.seed,
      encoder_inputs=encoder_inputs)
  results = []
  for row in range(out.tokens.shape[0]):
    new_ids = [int(t) for t in np.asarray(out.tokens[row, :int(out.lengths[row])])]
    shown_prefix = "" if task == "seq2seq" else decode_ids(dataset, ids)
    results.append(dict(step=step, ids=new_ids, score=float(out.scores[row]),
                        text=shown_prefix + decode_ids(dataset, new_ids)))
  return results


@cli.guarded  # configuration / workdir / prompt problems: one `error:` line, exit 2
def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
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
  from tfjax.training.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  logging.getLogger("tfjax").setLevel(logging.WARNING)  # the output is the text, nothing else
  main()


if __name__ == "__main__":
  run()
