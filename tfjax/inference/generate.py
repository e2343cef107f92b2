"""A restored run's prompts as text and continuations as text: the library of `tfjax-generate`
(whose command line, which restores the run, is tfjax/training/entry/generate_main.py).

Text datasets encode a prompt with the run's tokenizer (read from the workdir, so a run imported
from Hugging Face, which has no corpus, generates too: `python -m tfjax.hf import`, docs/hf.md;
its EOS stops generation and its decoder start token begins a seq2seq output). Synthetic tasks read
it in their display alphabet ('^' BOS, '|' SEP, '$' EOS, symbols as letters), so a copy-task LM is
prompted with "^abc|"; a seq2seq model takes the bare source ("abc") and decodes from [BOS].
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tfjax.data import synthetic, tokenizers
from tfjax.inference import decode


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


class _TokenIds:
  """The codec of a run whose tokenizer is a Hugging Face one it does not have (imported from a
  directory without tokenizer.json): prompts come as --prompt_ids, continuations show as ids."""

  special: dict = {}

  def __init__(self, workdir: str):
    self.workdir = workdir

  def encode(self, text: str):
    raise ValueError(f"run {self.workdir} has no tokenizer (imported without tokenizer.json): "
                     "give the prompt as token ids, --prompt_ids='1 4 5'")

  def decode(self, ids) -> str:
    return " ".join(str(int(i)) for i in ids)


def _text_codec(run):
  """The workdir's tokenizer if it holds one (no corpus needed), else the run's dataset; token
  ids for a run whose Hugging Face tokenizer is absent (its dataset cannot be built)."""
  if run.config.data.name in synthetic.TASKS:
    return run.dataset
  if os.path.exists(os.path.join(run.workdir, tokenizers.TOKENIZER_FILE)):
    return _SavedTokenizer(tokenizers.load_tokenizer(run.workdir))
  if run.config.data.get("tokenizer") == "hf":  # only ever loaded from the workdir, never built
    return _SavedTokenizer(_TokenIds(run.workdir))
  return run.dataset


def generate_for_run(run, args) -> list[dict]:
  """Continuations of args.prompt (or args.prompt_ids) by `run`, a training.runs.RestoredRun, with
  the settings of tfjax-generate's flags (`args`): one dict (step, ids, score, text) per row."""
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
      length_penalty=0.6 if getattr(args, "length_penalty", None) is None
      else args.length_penalty, eos_id=eos_id, rng=args.seed,
      encoder_inputs=encoder_inputs)
  results = []
  for row in range(out.tokens.shape[0]):
    new_ids = [int(t) for t in np.asarray(out.tokens[row, :int(out.lengths[row])])]
    shown_prefix = "" if task == "seq2seq" else decode_ids(dataset, ids)
    if shown_prefix and isinstance(getattr(dataset, "tokenizer", None), _TokenIds):
      shown_prefix += " "  # ids, not text: one space between prompt and continuation
    results.append(dict(step=step, ids=new_ids, score=float(out.scores[row]),
                        text=shown_prefix + decode_ids(dataset, new_ids)))
  return results
