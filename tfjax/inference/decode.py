"""Autoregressive generation with the KV cache: greedy, sampling (temperature/top-k/top-p), beam.

Flow (decoder-only and encoder-decoder alike):
  1. `init_cache` builds the 'cache' collection (tfjax/nn/kv_cache.py) for `batch` rows.
  2. Prefill: the whole prompt goes through the model in ONE call, filling the cache.
  3. Steps: one token per row per call, inside a single jitted `lax.while_loop` that stops early
     once every row is finished (EOS, or max_new_tokens reached).

Prompts of different lengths are LEFT-padded into one [B, P] array. Each row's tokens keep their
own absolute positions 0..len-1 (pads get position 0 and segment id 0, so the cache stores them at
position -1 and no query ever sees them). Left padding makes every row's next token land in the
same cache slot, so the single write counter of the cache serves the whole batch, and the last
prompt column holds every row's last token. RoPE, sinusoidal and learned tables therefore see each
token's true position, ALiBi true distances, and a sliding window is a ring buffer of `window`
slots. A padded array passed in with `prompt_lengths` is read as RIGHT-padded (tokens first, the
usual layout) and converted.

Any length can be generated: past model.max_len, absolute-position models (learned, sinusoidal)
re-run the model over the last max_len tokens for each new token, and relative ones go on with the
cache as a ring buffer of max_len slots (tfjax/inference/decode_window.py, with the costs).

For encoder-decoder models the encoder runs once (right-padded, padding hidden by segment ids);
the first decoder call caches every layer's projected encoder keys/values and later calls reuse
them. `prompt_ids` is then the decoder prefix, usually [[bos_id]] per row.

Shapes (letters as in tfjax/nn/axes.py): B prompts, M = sequences returned per prompt (num_samples),
R = B * M decoded rows (for beam search B * W, W = beam_size), P = padded prompt length,
N = max_new_tokens, V = vocab, C = beam candidates; S is the encoder length. Outputs are flat:
row b * M + m is sequence m of prompt b (as `num_return_sequences` in other libraries).

The model with its cache is cached_model.py; token choice and the greedy / sampling loop
sample_loop.py; beam search beam.py.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.inference import decode_window
from tfjax.inference.beam import beam_loop
from tfjax.inference.cached_model import (encode, forward_cached, inference_config, init_cache,
                                          left_padded_positions, take_cache_rows)
from tfjax.inference.sample_loop import sample_loop
from tfjax.inference.settings import Knobs, Plan
from tfjax.nn.choices import one_of
from tfjax.nn.config import ModelConfig
from tfjax.nn.positions import has_learned_table
from tfjax.runtime import workarounds

STRATEGIES = ("greedy", "sample", "beam")


class GenerateOutput(NamedTuple):
  """Row b * M + m holds sequence m of prompt b (M = num_samples; beam search: best first), so
  with M = 1 row b is prompt b.
  tokens [B * M, N]: generated tokens only (EOS included), pad_id after a row finished.
  lengths [B * M]: generated tokens per sequence, EOS included.
  scores [B * M]: greedy/sample: sum of the model's log-probabilities of the generated tokens
    (untempered, unfiltered); beam: that sum divided by the GNMT length penalty.
  """
  tokens: jax.Array
  lengths: jax.Array
  scores: jax.Array


def _right_to_left_padded(tokens_BxP, lengths_B, pad_id):
  length = tokens_BxP.shape[1]
  source_BxP = np.arange(length)[None, :] - (length - lengths_B)[:, None]
  gathered = np.take_along_axis(tokens_BxP, np.clip(source_BxP, 0, None), axis=1)
  return np.where(source_BxP >= 0, gathered, pad_id).astype(np.int32)


def _as_batch(ids, lengths, pad_id, what):
  """(list of lists) or (array [B, L] right-padded, optional lengths) -> numpy rows + lengths."""
  if isinstance(ids, (list, tuple)) and (
      not ids or isinstance(ids[0], (list, tuple, np.ndarray, jax.Array))):
    if lengths is not None:
      raise ValueError(f"{what}_lengths is only used with a padded array of {what}s")
    rows = [list(np.asarray(r, np.int64).reshape(-1)) for r in ids]
    lengths_B = np.asarray([len(r) for r in rows], np.int32)
    padded = np.full((len(rows), max(lengths_B, default=0)), pad_id, np.int32)
    for i, r in enumerate(rows):
      padded[i, :len(r)] = r
  else:
    padded = np.asarray(ids, np.int32)
    if padded.ndim != 2:
      raise ValueError(f"{what}s must be a list of token lists or a [batch, length] array; "
                       f"got shape {padded.shape}")
    lengths_B = (np.full(padded.shape[0], padded.shape[1], np.int32) if lengths is None
                 else np.asarray(lengths, np.int32).reshape(-1))
    if lengths_B.shape[0] != padded.shape[0] or np.any(lengths_B > padded.shape[1]):
      raise ValueError(f"{what}_lengths {lengths_B.tolist()} do not fit {what}s of shape "
                       f"{padded.shape}")
  if padded.shape[0] == 0:
    raise ValueError(f"no {what}s given")
  if np.any(lengths_B < 1):
    raise ValueError(f"every {what} needs at least one token (e.g. BOS); got lengths "
                     f"{lengths_B.tolist()}")
  return padded, lengths_B


# ---- generate ---------------------------------------------------------------------------------
def _generate(params, prompt_BxP, prompt_lengths_B, encoder_BxS, encoder_lengths_B, rng,
              knobs: Knobs, *, cfg: ModelConfig, plan: Plan):
  batch, padded_len = prompt_BxP.shape
  copies = plan.beam_size if plan.strategy == "beam" else plan.num_samples
  encoded = encoder_ids = None
  if cfg.family == "encoder_decoder":
    encoder_ids = (jnp.arange(encoder_BxS.shape[1])[None, :]
                   < encoder_lengths_B[:, None]).astype(jnp.int32)
    encoded = encode(cfg, params, encoder_BxS, encoder_ids)
  cache_len = padded_len + plan.max_new_tokens
  if plan.slide:  # the cache serves the tokens until the context is full
    cache_len = min(cache_len, cfg.max_len)
  cache = init_cache(cfg, batch, cache_len, None if encoder_BxS is None else encoder_BxS.shape[1])
  positions_BxP, segment_ids_BxP = left_padded_positions(prompt_lengths_B, padded_len)
  logits_BxPxV, cache = forward_cached(cfg, params, cache, prompt_BxP, positions_BxP,
                                       segment_ids_BxP, encoded, encoder_ids)
  # Every sample / beam of a prompt starts from a copy of that prompt's prefilled cache.
  rows_R = jnp.repeat(jnp.arange(batch), copies)
  cache = take_cache_rows(cfg, cache, rows_R)

  def cached_step(cache, token_R, position_R):
    logits_Rx1xV, cache = forward_cached(cfg, params, cache, token_R[:, None], position_R[:, None])
    return logits_Rx1xV.astype(jnp.float32), cache

  def step_fn(cache, token_R, position_R, generated_RxN, step):
    """Logits [R, 1, V] of token `step` (the previous one is token_R at position_R)."""
    if not plan.slide:
      return cached_step(cache, token_R, position_R)

    def slid():
      logits_Rx1xV = decode_window.last_window_logits(
          cfg, params, prompt_BxP[rows_R], prompt_lengths_B[rows_R], generated_RxN, step,
          None if encoded is None else encoded[rows_R],
          None if encoder_ids is None else encoder_ids[rows_R])
      return logits_Rx1xV, cache

    return jax.lax.cond(padded_len + step > cfg.max_len, slid,
                        lambda: cached_step(cache, token_R, position_R))

  last_logits_BxV = logits_BxPxV[:, -1]  # left padding: the last column is every row's last token
  if plan.strategy == "beam":
    return beam_loop(cfg, step_fn, cache, last_logits_BxV, prompt_lengths_B, plan, knobs)
  return sample_loop(step_fn, cache, last_logits_BxV[rows_R], prompt_lengths_B[rows_R], rng,
                      plan, knobs)


_generate_jit = jax.jit(_generate, static_argnames=("cfg", "plan"))
# XLA's backend optimizations off: a shorter compile for a slower decode
# (docs/benchmarks/cpu_training.md), the right trade for a training run's occasional short sample.
_generate_jit_fast_compile = jax.jit(_generate, static_argnames=("cfg", "plan"),
                                     compiler_options=workarounds.UNOPTIMIZED)


def _check_settings(cfg: ModelConfig, strategy, max_new_tokens, temperature, top_k, top_p,
                    num_samples, beam_size, eos_id, pad_id):
  one_of("strategy", strategy, STRATEGIES)
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
  if not temperature > 0:
    raise ValueError(f"temperature={temperature} must be > 0 (use strategy='greedy' for argmax)")
  if top_k is not None and not 1 <= top_k:
    raise ValueError(f"top_k={top_k} must be a positive integer or None")
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p} must be in (0, 1] or None")
  if num_samples < 1:
    raise ValueError(f"num_samples={num_samples} must be at least 1")
  if strategy == "greedy" and num_samples != 1:
    raise ValueError("greedy decoding is deterministic: num_samples must be 1")
  if strategy == "beam" and not 1 <= num_samples <= beam_size:
    raise ValueError(f"beam search returns at most beam_size={beam_size} hypotheses per "
                     f"prompt; got num_samples={num_samples}")
  for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
    if value is not None and not 0 <= value < cfg.vocab_size:
      raise ValueError(f"{name}={value} is outside the vocabulary [0, {cfg.vocab_size})")


def _check_encoder_length(cfg: ModelConfig, encoder_len):
  """The encoder reads its whole input at once: it cannot slide past a learned table."""
  if has_learned_table(cfg) and encoder_len is not None and encoder_len > cfg.max_len:
    raise ValueError(f"encoder inputs of {encoder_len} tokens exceed the learned position table "
                     f"(model.max_len={cfg.max_len}); shorten them to at most {cfg.max_len}")


def generate(model_config: ModelConfig, params,
             prompt_ids: Union[Sequence[Sequence[int]], np.ndarray, jax.Array], *,
             max_new_tokens: int, strategy: str = "greedy", temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, num_samples: int = 1,
             beam_size: int = 4, length_penalty: float = 0.6, eos_id: Optional[int] = None,
             pad_id: int = 0, rng: Union[int, jax.Array, None] = None, prompt_lengths=None,
             encoder_inputs=None, encoder_lengths=None,
             fast_compile: bool = False) -> GenerateOutput:
  """Continues every prompt by up to `max_new_tokens` tokens (see the module docstring).

  prompt_ids: list of token lists, or a right-padded [B, P] array with `prompt_lengths`
    (None = no padding). Encoder-decoder: the decoder prefix, e.g. [[bos_id]] * B.
  strategy: 'greedy' | 'sample' (temperature, then top_k, then top_p; num_samples per prompt)
    | 'beam' (beam_size beams, GNMT length_penalty alpha, num_samples = hypotheses returned).
  eos_id: a row stops after emitting it (None: always max_new_tokens); afterwards pad_id.
  rng: PRNG key or int seed for sampling (same seed, same inputs => same samples).
  encoder_inputs / encoder_lengths: encoder-decoder source, list or right-padded array.
  fast_compile: compile with XLA's backend optimizations off (CPU): faster to compile, slower
    per token; the same tokens up to float rounding. Meant for short, occasional samples.
  Returns GenerateOutput(tokens [B * M, N], lengths [B * M], scores [B * M]); M = num_samples.
  Compiles once per model config, batch/prompt/encoder shape, strategy, max_new_tokens,
  num_samples, beam_size, top_k and top_p-on/off; other settings are traced. Past model.max_len
  (prompt + max_new_tokens longer) it keeps the last max_len tokens as context: module docstring
  and tfjax/inference/decode_window.py.
  """
  cfg = inference_config(model_config)
  if cfg.family == "encoder":
    raise ValueError("model.family='encoder' is bidirectional and cannot generate")
  _check_settings(cfg, strategy, max_new_tokens, temperature, top_k, top_p, num_samples,
                  beam_size, eos_id, pad_id)
  prompts_BxP, prompt_lengths_B = _as_batch(prompt_ids, prompt_lengths, pad_id, "prompt")
  prompts_BxP = _right_to_left_padded(prompts_BxP, prompt_lengths_B, pad_id)
  encoder_BxS = encoder_lengths_B = None
  if cfg.family == "encoder_decoder":
    if encoder_inputs is None:
      raise ValueError("an encoder_decoder model needs encoder_inputs")
    encoder_BxS, encoder_lengths_B = _as_batch(encoder_inputs, encoder_lengths, pad_id,
                                               "encoder_input")
    if encoder_BxS.shape[0] != prompts_BxP.shape[0]:
      raise ValueError(f"{encoder_BxS.shape[0]} encoder inputs for {prompts_BxP.shape[0]} prompts")
  elif encoder_inputs is not None:
    raise ValueError("encoder_inputs are only used by family='encoder_decoder'")
  _check_encoder_length(cfg, None if encoder_BxS is None else encoder_BxS.shape[1])
  context = decode_window.mode(cfg, int(prompt_lengths_B.max()), int(max_new_tokens))
  if context == "slide":
    prompts_BxP, prompt_lengths_B = decode_window.crop_prompts(prompts_BxP, prompt_lengths_B,
                                                               cfg.max_len)
  elif context == "window":
    cfg = decode_window.windowed_config(cfg)
  if rng is None:
    rng = 0
  if isinstance(rng, (int, np.integer)):
    rng = jax.random.PRNGKey(int(rng))
  plan = Plan(strategy, int(max_new_tokens), int(num_samples), int(beam_size),
               None if top_k is None else int(top_k), top_p is not None and top_p < 1.0,
               slide=context == "slide")
  knobs = Knobs(jnp.float32(temperature), jnp.float32(1.0 if top_p is None else top_p),
                 jnp.float32(length_penalty), jnp.int32(-1 if eos_id is None else eos_id),
                 jnp.int32(pad_id))
  generate_jit = _generate_jit_fast_compile if fast_compile else _generate_jit
  tokens, lengths, scores = generate_jit(
      params, jnp.asarray(prompts_BxP), jnp.asarray(prompt_lengths_B),
      None if encoder_BxS is None else jnp.asarray(encoder_BxS),
      None if encoder_lengths_B is None else jnp.asarray(encoder_lengths_B), rng, knobs,
      cfg=cfg, plan=plan)
  return GenerateOutput(tokens, lengths, scores)
