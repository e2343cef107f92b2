"""Greedy and sampled decoding: token choice (temperature, top-k, top-p) and the while_loop that
extends every row by one token per step until EOS or max_new_tokens.

Shapes (letters as in tfjax/nn/axes.py): R decoded rows, N = max_new_tokens, V = vocab.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from tfjax.inference.settings import Knobs, Plan


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


class _SampleState(NamedTuple):
  step: jax.Array          # tokens chosen so far
  cache: dict
  tokens_RxN: jax.Array
  done_R: jax.Array
  lengths_R: jax.Array
  logprob_R: jax.Array
  rng: jax.Array


def _choose(state: _SampleState, logits_RxV, plan: Plan, knobs: Knobs) -> _SampleState:
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


def sample_loop(step_fn, cache, first_logits_RxV, prompt_lengths_R, rng, plan, knobs):
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
