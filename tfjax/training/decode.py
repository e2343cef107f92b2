"""Autoregressive generation with the KV cache: greedy, sampling (temperature/top-k/top-p), beam.

Flow (decoder-only and encoder-decoder alike):
  1. `init_cache` builds the 'cache' collection (see tfjax/nn/attention.py) for `batch` rows.
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
cache as a ring buffer of max_len slots (tfjax/training/decode_window.py, with the costs).

For encoder-decoder models the encoder runs once (right-padded, padding hidden by segment ids);
the first decoder call caches every layer's projected encoder keys/values and later calls reuse
them. `prompt_ids` is then the decoder prefix, usually [[bos_id]] per row.

Shapes (letters as in tfjax/nn/axes.py): B prompts, M = sequences returned per prompt (num_samples),
R = B * M decoded rows (for beam search B * W, W = beam_size), P = padded prompt length,
N = max_new_tokens, V = vocab, C = beam candidates; S is the encoder length. Outputs are flat:
row b * M + m is sequence m of prompt b (as `num_return_sequences` in other libraries).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training import decode_window, runtime
from tfjax.nn.choices import one_of
from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model
from tfjax.nn.positions import has_learned_table

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


# ---- model plumbing ---------------------------------------------------------------------------
def inference_config(model_config: ModelConfig) -> ModelConfig:
  """No dropout and no remat (there is no backward pass); parameters are unchanged by either."""
  return model_config.replace(deterministic=True, remat="none", decode=False)


def _cached_config(model_config: ModelConfig) -> ModelConfig:
  return inference_config(model_config).replace(decode=True)


def init_cache(model_config: ModelConfig, batch: int, max_len: int,
               encoder_len: Optional[int] = None):
  """The empty 'cache' collection for `batch` rows of up to `max_len` tokens (prompt + new).

  With a sliding window the self-attention caches hold only `window` slots (a ring buffer); with
  a window_pattern only the sliding layers' caches do.
  Encoder-decoder models also need `encoder_len`, the (padded) encoder length.
  """
  cfg = _cached_config(model_config)
  if cfg.family == "encoder":
    raise ValueError("model.family='encoder' is bidirectional and cannot generate")
  if cfg.family == "encoder_decoder" and encoder_len is None:
    raise ValueError("an encoder_decoder cache needs encoder_len (the padded encoder length)")
  # The cache is sized by the dummy input; a window caps it, so never trace a longer dummy (unless
  # global layers of a window_pattern need the full length; their sliding layers cap their own).
  sliding_only = cfg.window is not None and cfg.window_pattern is None
  length = min(max_len, cfg.window) if sliding_only else max_len
  tokens_BxL = jnp.zeros((batch, length), jnp.int32)
  model = build_model(cfg)

  def cache_only():
    rng = jax.random.PRNGKey(0)
    if cfg.family == "encoder_decoder":
      variables = model.init(rng, jnp.zeros((batch, encoder_len), jnp.int32), tokens_BxL)
    else:
      variables = model.init(rng, tokens_BxL)
    return variables["cache"]

  # Under jit XLA drops the parameter initialization: only the (zero) cache is an output.
  return jax.jit(cache_only)()


def encode(model_config: ModelConfig, params, encoder_tokens_BxS, encoder_segment_ids_BxS=None):
  """Encoder output [B, S, D] of an encoder-decoder model (run once per generation)."""
  model = build_model(inference_config(model_config))
  return model.apply({"params": params}, encoder_tokens_BxS, encoder_segment_ids_BxS,
                     method="encode")


def forward_cached(model_config: ModelConfig, params, cache, tokens_BxL, positions_BxL,
                   segment_ids_BxL=None, encoded_BxSxD=None, encoder_segment_ids_BxS=None):
  """Runs L new tokens per row through the model with the cache: prefill (L = prompt) or a step
  (L = 1). Returns (logits [B, L, V] float32, updated cache).

  positions are absolute; segment_ids 0 marks padding (stored at cache position -1). For
  encoder-decoder models pass the encoder output on the first call only (it is cached).
  """
  cfg = _cached_config(model_config)
  model = build_model(cfg)
  variables = {"params": params, "cache": cache}
  if cfg.family == "encoder_decoder":
    logits, mutated = model.apply(
        variables, encoded_BxSxD, tokens_BxL, encoder_segment_ids=encoder_segment_ids_BxS,
        decoder_segment_ids=segment_ids_BxL, decoder_positions=positions_BxL,
        mutable=["cache"], method="decode")
  else:
    logits, mutated = model.apply(variables, tokens_BxL, segment_ids=segment_ids_BxL,
                                  positions=positions_BxL, mutable=["cache"])
  return logits, mutated["cache"]


def _cache_batch_axis(cfg: ModelConfig) -> int:
  return 1 if cfg.scan_layers else 0  # nn.scan stacks the layers' caches on a leading axis


def take_cache_rows(model_config: ModelConfig, cache, rows_R):
  """The cache of rows `rows_R` (repeat a prompt's cache per sample, reorder beams)."""
  axis = _cache_batch_axis(model_config)
  # The write counter ('index') has no batch axis: it is shared by all rows.
  return jax.tree.map(lambda x: jnp.take(x, rows_R, axis=axis) if x.ndim > axis else x, cache)


# ---- prompts ----------------------------------------------------------------------------------
def _right_to_left_padded(tokens_BxP, lengths_B, pad_id):
  length = tokens_BxP.shape[1]
  source_BxP = np.arange(length)[None, :] - (length - lengths_B)[:, None]
  gathered = np.take_along_axis(tokens_BxP, np.clip(source_BxP, 0, None), axis=1)
  return np.where(source_BxP >= 0, gathered, pad_id).astype(np.int32)


def left_padded_positions(lengths_B, padded_len: int):
  """(positions, segment_ids) [B, P] of left-padded prompts: tokens at 0..len-1, pads 0 / id 0."""
  offset_BxP = jnp.arange(padded_len, dtype=jnp.int32)[None, :] - (padded_len - lengths_B)[:, None]
  return jnp.maximum(offset_BxP, 0), (offset_BxP >= 0).astype(jnp.int32)


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


# ---- token selection --------------------------------------------------------------------------
def filter_logits(logits_BxV, *, temperature=1.0, top_k: Optional[int] = None, top_p=None):
  """Temperature, then top-k, then top-p (nucleus) on the top-k survivors; removed tokens -> -inf.

  top-p keeps the smallest set of most likely tokens whose probability reaches p (the most likely
  token is always kept; tokens tied with the last kept one are kept too). temperature and top_p
  may be traced; top_k is static.
  """
  logits_BxV = logits_BxV.astype(jnp.float32) / temperature
  vocab = logits_BxV.shape[-1]
  if top_k is not None and top_k < vocab:
    kth_largest_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_largest_Bx1, -jnp.inf, logits_BxV)
  if top_p is not None:
    sorted_BxV = jax.lax.top_k(logits_BxV, vocab)[0]  # descending
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    num_kept_B = jnp.sum(mass_before_BxV < top_p, axis=-1)  # >= 1: mass before the first is 0
    threshold_Bx1 = jnp.take_along_axis(sorted_BxV, num_kept_B[:, None] - 1, axis=-1)
    logits_BxV = jnp.where(logits_BxV < threshold_Bx1, -jnp.inf, logits_BxV)
  return logits_BxV


def gnmt_length_penalty(length, alpha):
  """Wu et al. (2016): ((5 + length) / 6) ** alpha; beam scores are log-prob / penalty."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What shapes the compiled program (jit recompiles when it changes)."""
  strategy: str
  max_new_tokens: int
  num_samples: int
  beam_size: int
  top_k: Optional[int]
  use_top_p: bool
  slide: bool = False  # decode_window 'slide': re-run the last max_len tokens once past max_len


class _Knobs(NamedTuple):
  """Scalars passed as traced values, so changing them reuses the compiled program."""
  temperature: jax.Array
  top_p: jax.Array
  length_penalty: jax.Array
  eos_id: jax.Array  # -1 = no EOS
  pad_id: jax.Array


# ---- greedy / sampling loop -------------------------------------------------------------------
class _SampleState(NamedTuple):
  step: jax.Array          # tokens chosen so far
  cache: dict
  tokens_RxN: jax.Array
  done_R: jax.Array
  lengths_R: jax.Array
  logprob_R: jax.Array
  rng: jax.Array


def _choose(state: _SampleState, logits_RxV, plan: _Plan, knobs: _Knobs) -> _SampleState:
  """Picks token `state.step` of every row; finished rows emit pad_id."""
  rng, key = jax.random.split(state.rng)
  if plan.strategy == "greedy":
    token_R = jnp.argmax(logits_RxV, axis=-1).astype(jnp.int32)
  else:
    filtered = filter_logits(logits_RxV, temperature=knobs.temperature, top_k=plan.top_k,
                             top_p=knobs.top_p if plan.use_top_p else None)
    token_R = jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)
  token_R = jnp.where(state.done_R, knobs.pad_id, token_R)
  logprob_R = jnp.take_along_axis(jax.nn.log_softmax(logits_RxV, axis=-1), token_R[:, None], -1)
  live_R = ~state.done_R
  return state._replace(
      step=state.step + 1, tokens_RxN=state.tokens_RxN.at[:, state.step].set(token_R),
      done_R=state.done_R | (token_R == knobs.eos_id), lengths_R=state.lengths_R + live_R,
      logprob_R=state.logprob_R + jnp.where(live_R, logprob_R[:, 0], 0.0), rng=rng)


def _sample_loop(step_fn, cache, first_logits_RxV, prompt_lengths_R, rng, plan, knobs):
  rows = first_logits_RxV.shape[0]
  state = _SampleState(
      step=jnp.zeros((), jnp.int32), cache=cache,
      tokens_RxN=jnp.full((rows, plan.max_new_tokens), knobs.pad_id, jnp.int32),
      done_R=jnp.zeros((rows,), bool), lengths_R=jnp.zeros((rows,), jnp.int32),
      logprob_R=jnp.zeros((rows,), jnp.float32), rng=rng)
  state = _choose(state, first_logits_RxV, plan, knobs)  # token 0 comes from the prefill logits

  def keep_going(st):
    return (st.step < plan.max_new_tokens) & ~jnp.all(st.done_R)

  def body(st):
    last_R = st.tokens_RxN[:, st.step - 1]
    logits_Rx1xV, cache = step_fn(st.cache, last_R, prompt_lengths_R + st.step - 1,
                                  st.tokens_RxN, st.step)
    return _choose(st._replace(cache=cache), logits_Rx1xV[:, 0], plan, knobs)

  state = jax.lax.while_loop(keep_going, body, state)
  return state.tokens_RxN, state.lengths_R, state.logprob_R


# ---- beam search ------------------------------------------------------------------------------
class _BeamState(NamedTuple):
  step: jax.Array
  cache: dict              # rows of the *previous* alive beams; reordered by `parents` lazily
  parents_BxW: jax.Array   # which previous beam each alive beam extends
  alive_BxWxN: jax.Array
  alive_logprob_BxW: jax.Array
  finished_BxWxN: jax.Array
  finished_score_BxW: jax.Array  # sorted best first; -inf = empty
  finished_len_BxW: jax.Array
  done_B: jax.Array


def _beam_choose(state: _BeamState, logits_BxWxV, plan: _Plan, knobs: _Knobs) -> _BeamState:
  """Extends every alive beam by every token, keeps the best `beam_size` unfinished extensions
  alive and merges the best-ranked ones that end (EOS or max length) into the finished set."""
  batch, beams, vocab = logits_BxWxV.shape
  step, alpha = state.step, knobs.length_penalty
  candidate_BxWxV = (state.alive_logprob_BxW[:, :, None]
                     + jax.nn.log_softmax(logits_BxWxV.astype(jnp.float32), axis=-1))
  # 2W candidates guarantee W non-EOS ones survive even if W of them end with EOS.
  num_candidates = min(2 * beams, beams * vocab)
  cand_logprob_BxC, flat_BxC = jax.lax.top_k(candidate_BxWxV.reshape(batch, -1), num_candidates)
  cand_parent_BxC, cand_token_BxC = flat_BxC // vocab, (flat_BxC % vocab).astype(jnp.int32)
  cand_seq_BxCxN = jnp.take_along_axis(state.alive_BxWxN, cand_parent_BxC[:, :, None], axis=1)
  cand_seq_BxCxN = cand_seq_BxCxN.at[:, :, step].set(cand_token_BxC)
  ends_BxC = (cand_token_BxC == knobs.eos_id) | (step + 1 >= plan.max_new_tokens)

  alive_logprob_BxW, pick_BxW = jax.lax.top_k(
      jnp.where(ends_BxC, -jnp.inf, cand_logprob_BxC), beams)
  alive_BxWxN = jnp.take_along_axis(cand_seq_BxCxN, pick_BxW[:, :, None], axis=1)
  parents_BxW = jnp.take_along_axis(cand_parent_BxC, pick_BxW, axis=1)

  # As in fairseq, a hypothesis is finalized only if it ranks among the top W candidates (it
  # would have taken a beam); that makes beam_size=1 exactly greedy search.
  finalized_BxC = ends_BxC & (jnp.arange(num_candidates) < beams)[None, :]
  length = step + 1
  ended_score_BxC = jnp.where(
      finalized_BxC, cand_logprob_BxC / gnmt_length_penalty(length, alpha), -jnp.inf)
  all_score = jnp.concatenate([state.finished_score_BxW, ended_score_BxC], axis=1)
  all_seq = jnp.concatenate([state.finished_BxWxN, cand_seq_BxCxN], axis=1)
  all_len = jnp.concatenate(
      [state.finished_len_BxW, jnp.full(ended_score_BxC.shape, length, jnp.int32)], axis=1)
  finished_score_BxW, keep_BxW = jax.lax.top_k(all_score, beams)
  finished_BxWxN = jnp.take_along_axis(all_seq, keep_BxW[:, :, None], axis=1)
  finished_len_BxW = jnp.take_along_axis(all_len, keep_BxW, axis=1)
  # A finished row keeps its result while other rows go on (ties must not reshuffle it).
  frozen_B = state.done_B
  finished_score_BxW = jnp.where(frozen_B[:, None], state.finished_score_BxW, finished_score_BxW)
  finished_len_BxW = jnp.where(frozen_B[:, None], state.finished_len_BxW, finished_len_BxW)
  finished_BxWxN = jnp.where(frozen_B[:, None, None], state.finished_BxWxN, finished_BxWxN)

  # Log-probs only fall as beams grow, so an alive beam's best possible final score is its
  # log-prob over the most favourable penalty still reachable (the longest length for alpha >= 0,
  # the shortest for alpha < 0); when even that cannot beat the worst kept hypothesis the row's
  # result is final.
  best_len = jnp.where(alpha >= 0, plan.max_new_tokens,
                       jnp.minimum(length + 1, plan.max_new_tokens))
  optimistic_B = alive_logprob_BxW[:, 0] / gnmt_length_penalty(best_len, alpha)
  done_B = (state.done_B | (finished_score_BxW[:, -1] >= optimistic_B)
            | jnp.isneginf(alive_logprob_BxW[:, 0]))
  return _BeamState(
      step=step + 1, cache=state.cache, parents_BxW=parents_BxW, alive_BxWxN=alive_BxWxN,
      alive_logprob_BxW=alive_logprob_BxW, finished_BxWxN=finished_BxWxN,
      finished_score_BxW=finished_score_BxW, finished_len_BxW=finished_len_BxW, done_B=done_B)


def _beam_loop(cfg, step_fn, cache_BW, first_logits_BxV, prompt_lengths_B, plan, knobs):
  batch, vocab = first_logits_BxV.shape
  beams, n = plan.beam_size, plan.max_new_tokens
  # All beams start as copies of the prompt; only beam 0 is live so the first step does not pick
  # the same token W times.
  state = _BeamState(
      step=jnp.zeros((), jnp.int32), cache=cache_BW,
      parents_BxW=jnp.zeros((batch, beams), jnp.int32),
      alive_BxWxN=jnp.full((batch, beams, n), knobs.pad_id, jnp.int32),
      alive_logprob_BxW=jnp.full((batch, beams), -jnp.inf).at[:, 0].set(0.0),
      finished_BxWxN=jnp.full((batch, beams, n), knobs.pad_id, jnp.int32),
      finished_score_BxW=jnp.full((batch, beams), -jnp.inf),
      finished_len_BxW=jnp.zeros((batch, beams), jnp.int32), done_B=jnp.zeros((batch,), bool))
  first_BxWxV = jnp.broadcast_to(first_logits_BxV[:, None], (batch, beams, vocab))
  state = _beam_choose(state, first_BxWxV, plan, knobs)
  positions_BW = jnp.repeat(prompt_lengths_B, beams)

  def keep_going(st):
    return (st.step < n) & ~jnp.all(st.done_B)

  def body(st):
    rows_BW = (jnp.arange(batch)[:, None] * beams + st.parents_BxW).reshape(-1)
    cache = take_cache_rows(cfg, st.cache, rows_BW)
    last_BW = st.alive_BxWxN[:, :, st.step - 1].reshape(-1)
    logits_BWx1xV, cache = step_fn(cache, last_BW, positions_BW + st.step - 1,
                                   st.alive_BxWxN.reshape(batch * beams, n), st.step)
    return _beam_choose(st._replace(cache=cache), logits_BWx1xV.reshape(batch, beams, -1), plan,
                        knobs)

  state = jax.lax.while_loop(keep_going, body, state)
  top = plan.num_samples  # the finished set is sorted best first
  return (state.finished_BxWxN[:, :top].reshape(batch * top, n),
          state.finished_len_BxW[:, :top].reshape(-1),
          state.finished_score_BxW[:, :top].reshape(-1))


# ---- generate ---------------------------------------------------------------------------------
def _generate(params, prompt_BxP, prompt_lengths_B, encoder_BxE, encoder_lengths_B, rng,
              knobs: _Knobs, *, cfg: ModelConfig, plan: _Plan):
  batch, padded_len = prompt_BxP.shape
  copies = plan.beam_size if plan.strategy == "beam" else plan.num_samples
  encoded = encoder_ids = None
  if cfg.family == "encoder_decoder":
    encoder_ids = (jnp.arange(encoder_BxE.shape[1])[None, :]
                   < encoder_lengths_B[:, None]).astype(jnp.int32)
    encoded = encode(cfg, params, encoder_BxE, encoder_ids)
  cache_len = padded_len + plan.max_new_tokens
  if plan.slide:  # the cache serves the tokens until the context is full
    cache_len = min(cache_len, cfg.max_len)
  cache = init_cache(cfg, batch, cache_len, None if encoder_BxE is None else encoder_BxE.shape[1])
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
    return _beam_loop(cfg, step_fn, cache, last_logits_BxV, prompt_lengths_B, plan, knobs)
  return _sample_loop(step_fn, cache, last_logits_BxV[rows_R], prompt_lengths_B[rows_R], rng,
                      plan, knobs)


_generate_jit = jax.jit(_generate, static_argnames=("cfg", "plan"))
# XLA's backend optimizations off: a shorter compile for a slower decode (docs/benchmarks.md), the
# right trade for a training run's occasional short sample.
_generate_jit_fast_compile = jax.jit(_generate, static_argnames=("cfg", "plan"),
                                     compiler_options=runtime.UNOPTIMIZED)


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
  and tfjax/training/decode_window.py.
  """
  cfg = inference_config(model_config)
  if cfg.family == "encoder":
    raise ValueError("model.family='encoder' is bidirectional and cannot generate")
  _check_settings(cfg, strategy, max_new_tokens, temperature, top_k, top_p, num_samples,
                  beam_size, eos_id, pad_id)
  prompts_BxP, prompt_lengths_B = _as_batch(prompt_ids, prompt_lengths, pad_id, "prompt")
  prompts_BxP = _right_to_left_padded(prompts_BxP, prompt_lengths_B, pad_id)
  encoder_BxE = encoder_lengths_B = None
  if cfg.family == "encoder_decoder":
    if encoder_inputs is None:
      raise ValueError("an encoder_decoder model needs encoder_inputs")
    encoder_BxE, encoder_lengths_B = _as_batch(encoder_inputs, encoder_lengths, pad_id,
                                               "encoder_input")
    if encoder_BxE.shape[0] != prompts_BxP.shape[0]:
      raise ValueError(f"{encoder_BxE.shape[0]} encoder inputs for {prompts_BxP.shape[0]} prompts")
  elif encoder_inputs is not None:
    raise ValueError("encoder_inputs are only used by family='encoder_decoder'")
  _check_encoder_length(cfg, None if encoder_BxE is None else encoder_BxE.shape[1])
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
  plan = _Plan(strategy, int(max_new_tokens), int(num_samples), int(beam_size),
               None if top_k is None else int(top_k), top_p is not None and top_p < 1.0,
               slide=context == "slide")
  knobs = _Knobs(jnp.float32(temperature), jnp.float32(1.0 if top_p is None else top_p),
                 jnp.float32(length_penalty), jnp.int32(-1 if eos_id is None else eos_id),
                 jnp.int32(pad_id))
  generate_jit = _generate_jit_fast_compile if fast_compile else _generate_jit
  tokens, lengths, scores = generate_jit(
      params, jnp.asarray(prompts_BxP), jnp.asarray(prompt_lengths_B),
      None if encoder_BxE is None else jnp.asarray(encoder_BxE),
      None if encoder_lengths_B is None else jnp.asarray(encoder_lengths_B), rng, knobs,
      cfg=cfg, plan=plan)
  return GenerateOutput(tokens, lengths, scores)
