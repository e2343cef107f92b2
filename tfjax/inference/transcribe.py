"""`tfjax-generate` on a Whisper run (config.task='whisper', e.g. one imported with
`python -m tfjax.hf import`): transcribes --audio=A.wav[,B.wav] (16-bit mono 16 kHz, made into
Whisper's log-mel features by tfjax/data/log_mel.py) or --features=F.npy ([frames, mels] or
[batch, frames, mels]) greedily or with beam search (tfjax/inference/whisper_decode.py).

The run's generation_config.json (kept by the import in RUN/hf/) sets the decoder prompt
(decoder start, language and task tokens from forced_decoder_ids / --language / --whisper_task,
no_timestamps), the suppress lists and the beam length penalty, as transformers' `generate`
reads them; without one the prompt is the model's decoder start id and nothing is suppressed.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from tfjax.data import tokenizers
from tfjax.inference import whisper_decode
from tfjax.nn import audio

GENERATION_FILE = "generation_config.json"


def generation_config(origin_dir: str) -> dict:
  """The generation config the import kept in the run's origin folder (RUN/hf/), or {}."""
  path = os.path.join(origin_dir, GENERATION_FILE)
  if not os.path.exists(path):
    return {}
  from tfjax.runtime import files  # pylint: disable=import-outside-toplevel
  return files.read_json(path)


def load_features(args, cfg) -> np.ndarray:
  """[B, frames, mels] float32 from --features or --audio; one-line errors otherwise."""
  want = (cfg.num_frames, cfg.num_mels)
  if getattr(args, "features", None):
    x = np.load(args.features).astype(np.float32)
    x = x[None] if x.ndim == 2 else x
    if x.ndim != 3 or tuple(x.shape[1:]) != want:
      raise ValueError(f"--features={args.features} has shape {tuple(x.shape)}; this Whisper "
                       f"reads [batch, {want[0]}, {want[1]}] (frames, mel bins)")
    return x
  if getattr(args, "audio", None):
    # pylint: disable-next=import-outside-toplevel
    from tfjax.data import audio_folder, log_mel
    if cfg.num_frames % 100:
      raise ValueError(f"this Whisper reads {cfg.num_frames} frames, not whole seconds of "
                       "audio (100 frames a second): give --features=F.npy instead")
    return np.stack([log_mel.log_mel(audio_folder.read_wav(path), n_mels=cfg.num_mels,
                                     chunk_seconds=cfg.num_frames // 100)
                     for path in args.audio.split(",")])
  raise ValueError("a Whisper run transcribes audio: give --audio=A.wav[,B.wav] or "
                   "--features=F.npy")


def _score(cfg, params, x, tokens_BxN, start: int, ends) -> np.ndarray:
  """[B] summed log-probability of each row's new tokens (through its EOS)."""
  logits = audio.Whisper(cfg).apply({"params": params}, x, tokens_BxN[:, :-1])
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  picked = np.take_along_axis(log_probs, np.asarray(tokens_BxN)[:, 1:, None], axis=-1)[..., 0]
  return np.array([picked[b, start - 1:ends[b]].sum() for b in range(len(ends))])


def transcribe_for_run(run, args, origin_dir: str) -> list:
  """One dict (step, ids, score, text) per input of args.audio / args.features."""
  cfg, params = run.model_config, run.params
  if args.strategy not in ("greedy", "beam"):
    raise ValueError(f"--strategy={args.strategy}: a Whisper run decodes with greedy or beam")
  generation = generation_config(origin_dir)
  x = load_features(args, cfg)
  if args.prompt_ids is not None:
    ids = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    prompt = np.tile(np.asarray(ids, np.int32), (x.shape[0], 1))
  else:
    prompt = whisper_decode.prompts(cfg, params, x, generation, args.language,
                                    args.whisper_task)
  suppress = generation.get("suppress_tokens") or []
  begin_suppress = generation.get("begin_suppress_tokens") or []
  start = prompt.shape[1]
  if args.strategy == "beam":
    penalty = (args.length_penalty if args.length_penalty is not None
               else generation.get("length_penalty", 1.0))
    tokens, scores = whisper_decode.beam_search(
        cfg, params, x, prompt, args.max_new_tokens, args.beam_size, penalty, suppress,
        begin_suppress)
  else:
    tokens = audio.greedy_decode(cfg, params, x, args.max_new_tokens, prompt, suppress,
                                 begin_suppress)
  tokens = np.asarray(tokens)
  ends = []
  for row in tokens:
    eos = np.flatnonzero(row[start:] == cfg.eos_id)
    ends.append(start + (int(eos[0]) + 1 if len(eos) else len(row) - start))
  if args.strategy == "greedy":
    scores = _score(cfg, params, x, tokens, start, ends)
  tokenizer = (tokenizers.load_tokenizer(run.workdir)
               if os.path.exists(os.path.join(run.workdir, tokenizers.TOKENIZER_FILE)) else None)
  results = []
  for b, row in enumerate(tokens):
    new_ids = [int(t) for t in row[start:ends[b]]]
    text = (tokenizer.decode(new_ids) if tokenizer is not None
            else " ".join(str(t) for t in new_ids))
    results.append(dict(step=run.step, ids=new_ids, prompt=[int(t) for t in prompt[b]],
                        score=float(scores[b]), text=text))
  return results
