"""Whisper transcription: the decoder prompt a released generation config asks for, and beam
search as transformers' `generate(num_beams=W)` runs it (greedy: tfjax/nn/audio.py
`greedy_decode`).

The prompt (transformers' WhisperGenerationMixin._retrieve_init_tokens, short-form, no
timestamps): decoder_start_token_id, then the language token (`language`, else the
forced_decoder_ids' position-1 token, else detected per row: the likeliest of lang_to_id's tokens
after the start token), then the task token (`task`, else the forced one, else 'transcribe'
when a language was given), then no_timestamps_token_id when the config has one. Generation then
never emits `suppress_tokens`, nor `begin_suppress_tokens` as its first token.

Beam search (transformers 5's vectorized `_beam_search`, early_stopping=False): each step
extends the W running beams by every token (log-softmax, then the suppression at -inf), keeps the
2W best candidates; of those, the W best that do not end (EOS or the length limit) run on, and
the ones among the first W that end compete for the W finished slots with score log-prob /
generated_length ** length_penalty. A row stops changing once every finished slot is filled and
its best running beam, scored at the current length, is no better than its worst finished one.
Shapes: B rows, W beams, V vocabulary, N = prompt + new tokens.
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn.audio import Whisper, WhisperConfig

NEG = -1.0e9  # transformers' "impossible" score (added, not -inf, so sums stay ordered)


def _language_token(language: str, lang_to_id: dict) -> int:
  for key in (language, f"<|{language}|>", f"<|{language.lower()}|>"):
    if key in lang_to_id:
      return lang_to_id[key]
  raise ValueError(f"--language={language!r} is not one of this model's languages "
                   f"({', '.join(sorted(lang_to_id)[:8])}, ...; generation_config.json "
                   "lang_to_id)")


def prompt_tokens(cfg: WhisperConfig, generation: dict, language: Optional[str] = None,
                  task: Optional[str] = None) -> list:
  """The decoder prompt of the module docstring, with None where the language is to be
  detected (`detect_languages` fills it)."""
  tokens = [generation.get("decoder_start_token_id", cfg.decoder_start_id)]
  lang_to_id, task_to_id = generation.get("lang_to_id"), generation.get("task_to_id")
  if language is None and task is None:
    forced = generation.get("forced_decoder_ids") or []
    position = 1
    while forced and forced[0][0] == position:  # [[1, lang], [2, task], [3, no_timestamps]]
      tokens.append(forced[0][1])
      forced, position = forced[1:], position + 1
  if language is not None:
    if not lang_to_id:
      raise ValueError("--language needs a multilingual model (generation_config.json with "
                       "lang_to_id)")
    code = _language_token(language, lang_to_id)
    tokens = tokens[:1] + [code] + tokens[2:] if len(tokens) > 1 else tokens + [code]
  elif lang_to_id and (len(tokens) <= 1 or tokens[1] is None):
    tokens = tokens[:1] + [None] + tokens[2:]  # detected per row
  if task is not None:
    if not task_to_id or task not in task_to_id:
      raise ValueError(f"--whisper_task={task!r}: this model's tasks are "
                       f"{sorted(task_to_id or {})} (generation_config.json task_to_id)")
    known = set(task_to_id.values())
    if any(t in known for t in tokens):
      tokens = [task_to_id[task] if t in known else t for t in tokens]
    else:
      tokens.append(task_to_id[task])
  elif language is not None and task_to_id and not any(
      t in set(task_to_id.values()) for t in tokens):
    tokens.append(task_to_id["transcribe"])
  no_timestamps = generation.get("no_timestamps_token_id")
  if no_timestamps is not None and tokens[-1] != no_timestamps:
    tokens.append(no_timestamps)
  return tokens


def detect_languages(cfg: WhisperConfig, params, features_BxTxM, start: int,
                     lang_to_id: dict) -> np.ndarray:
  """[B] the likeliest language token of each row after the start token."""
  logits = Whisper(cfg).apply({"params": params}, features_BxTxM,
                              jnp.full((features_BxTxM.shape[0], 1), start, jnp.int32))
  ids = np.asarray(sorted(lang_to_id.values()), np.int32)
  return ids[np.argmax(np.asarray(logits)[:, -1, ids], axis=-1)]


def prompts(cfg: WhisperConfig, params, features_BxTxM, generation: dict,
            language: Optional[str] = None, task: Optional[str] = None) -> np.ndarray:
  """[B, P] int32 decoder prompts (languages detected where the config asks for it)."""
  tokens = prompt_tokens(cfg, generation, language, task)
  batch = features_BxTxM.shape[0]
  out = np.zeros((batch, len(tokens)), np.int32)
  for i, t in enumerate(tokens):
    if t is None:
      out[:, i] = detect_languages(cfg, params, features_BxTxM, tokens[0],
                                   generation["lang_to_id"])
    else:
      out[:, i] = t
  return out


def banned_masks(vocab: int, suppress: Sequence[int], begin_suppress: Sequence[int]):
  """([V] never allowed, [V] not allowed as the first new token) boolean masks."""
  for name, ids in (("suppress_tokens", suppress), ("begin_suppress_tokens", begin_suppress)):
    bad = [i for i in ids if not 0 <= int(i) < vocab]
    if bad:
      raise ValueError(f"{name} {bad} are not token ids of the vocabulary (0..{vocab - 1})")
  banned_V = jnp.zeros((vocab,), bool).at[jnp.asarray(list(suppress), jnp.int32)].set(True)
  return banned_V, banned_V.at[jnp.asarray(list(begin_suppress), jnp.int32)].set(True)


def beam_search(cfg: WhisperConfig, params, features_BxTxM, prompt_BxP, max_new_tokens: int,
                num_beams: int, length_penalty: float = 1.0, suppress_tokens=(),
                begin_suppress_tokens=(), pad_id: Optional[int] = None):
  """(tokens [B, P + max_new_tokens] of each row's best finished beam, padded with `pad_id`
  (default eos) after its EOS; scores [B]), as the module docstring says."""
  prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
  batch, start = prompt_BxP.shape
  total, beams, vocab = start + max_new_tokens, num_beams, cfg.vocab_size
  if total > cfg.max_target_positions:
    raise ValueError(f"prompt {start} + max_new_tokens {max_new_tokens} exceeds "
                     f"max_target_positions={cfg.max_target_positions}")
  fill = cfg.eos_id if pad_id is None else pad_id
  banned_V, banned_first_V = banned_masks(vocab, suppress_tokens, begin_suppress_tokens)
  model = Whisper(cfg)
  encoded = model.apply({"params": params}, features_BxTxM, method=Whisper.encode)
  encoded_BWxSxD = jnp.repeat(encoded, beams, axis=0)
  seq_BxWxN = jnp.full((batch, beams, total), fill, jnp.int32).at[:, :, :start].set(
      prompt_BxP[:, None, :])
  running_BxW = jnp.zeros((batch, beams), jnp.float32).at[:, 1:].set(NEG)
  finished_BxWxN = seq_BxWxN
  finished_score_BxW = jnp.full((batch, beams), NEG, jnp.float32)
  finished_BxW = jnp.zeros((batch, beams), bool)
  open_B = jnp.ones((batch,), bool)
  first_beams_C = jnp.arange(2 * beams) < beams

  def gather(x, index_BxK):
    return jnp.take_along_axis(x, index_BxK.reshape(index_BxK.shape + (1,) * (x.ndim - 2)),
                               axis=1)

  def step(t, state):
    seq, running, fin_seq, fin_score, fin, open_ = state
    logits = model.apply({"params": params}, encoded_BWxSxD, seq.reshape(batch * beams, total),
                         method=Whisper.decode)
    logits_BxWxV = jax.lax.dynamic_index_in_dim(logits, t - 1, axis=1,
                                                keepdims=False).reshape(batch, beams, vocab)
    log_probs = jax.nn.log_softmax(logits_BxWxV.astype(jnp.float32), axis=-1)
    log_probs = jnp.where(jnp.where(t == start, banned_first_V, banned_V), -jnp.inf, log_probs)
    total_BxWV = (log_probs + running[:, :, None]).reshape(batch, beams * vocab)
    cand_score_BxC, flat_BxC = jax.lax.top_k(total_BxWV, 2 * beams)
    parent_BxC, token_BxC = flat_BxC // vocab, (flat_BxC % vocab).astype(jnp.int32)
    cand_seq = gather(seq, parent_BxC)
    cand_seq = jax.lax.dynamic_update_slice_in_dim(cand_seq, token_BxC[:, :, None], t, axis=2)
    ends_BxC = (token_BxC == cfg.eos_id) | (t + 1 >= total)
    # the beams that run on: the best W candidates that do not end
    keep_score_BxC = cand_score_BxC + ends_BxC.astype(jnp.float32) * NEG
    running, pick_BxW = jax.lax.top_k(keep_score_BxC, beams)
    seq = gather(cand_seq, pick_BxW)
    # the ones that end, among the first W candidates, compete for the finished slots
    ended = cand_score_BxC / ((t + 1 - start) ** length_penalty)
    ended = ended + (~open_[:, None]).astype(jnp.float32) * NEG
    ended = ended + (~(ends_BxC & first_beams_C[None, :])).astype(jnp.float32) * NEG
    merged_score = jnp.concatenate([fin_score, ended], axis=1)
    merged_seq = jnp.concatenate([fin_seq, cand_seq], axis=1)
    merged_fin = jnp.concatenate([fin, ends_BxC & first_beams_C[None, :]], axis=1)
    fin_score, best_BxW = jax.lax.top_k(merged_score, beams)
    fin_seq, fin = gather(merged_seq, best_BxW), gather(merged_fin, best_BxW)
    # a row stays open while its best running beam could still beat a finished one
    best_running_B = running[:, 0] / ((t + 1 - start) ** length_penalty)
    worst_BxW = jnp.where(fin, jnp.min(fin_score, axis=1, keepdims=True), NEG)
    open_ = open_ & jnp.any(best_running_B[:, None] > worst_BxW, axis=1)
    return seq, running, fin_seq, fin_score, fin, open_

  state = (seq_BxWxN, running_BxW, finished_BxWxN, finished_score_BxW, finished_BxW, open_B)
  _, _, fin_seq, fin_score, _, _ = jax.lax.fori_loop(start, total, step, state)
  best_BxN = fin_seq[:, 0]
  # transformers pads after EOS; the slots after a finished beam's EOS already hold `fill`
  return best_BxN, fin_score[:, 0]
