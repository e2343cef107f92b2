"""Beam search: W beams per prompt, hypotheses ranked by log-probability over the GNMT length
penalty (Wu et al., 2016), finished rows frozen while the others go on, all in one while_loop.

Shapes (letters as in tfjax/nn/axes.py): B prompts, W = beam_size, N = max_new_tokens, V = vocab,
C = candidates per step (2W).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tfjax.inference.cached_model import take_cache_rows
from tfjax.inference.settings import Knobs, Plan


def gnmt_length_penalty(length, alpha):
  """Wu et al. (2016): ((5 + length) / 6) ** alpha; beam scores are log-prob / penalty."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


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


def _beam_choose(state: _BeamState, logits_BxWxV, plan: Plan, knobs: Knobs) -> _BeamState:
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


def beam_loop(cfg, step_fn, cache_BW, first_logits_BxV, prompt_lengths_B, plan, knobs):
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
