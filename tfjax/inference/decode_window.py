"""Generating past a model's context (model.max_len): how decode.generate keeps going.

A model trained on rows of `max_len` tokens has only seen contexts that long. When a prompt plus
max_new_tokens needs more, generation keeps the context at the last `max_len` tokens, in one of
two ways depending on the position encoding:

* "slide", absolute positions (learned table, sinusoidal): position p of a token depends on where
  the context starts, so once the context is full every new token re-runs the model over the last
  max_len tokens at positions 0..max_len-1 (a full forward pass, no cache; the KV cache serves the
  tokens before that point). This is nanoGPT's cropped-context sampling. Cost: each token past
  max_len costs one forward pass over max_len tokens, about max_len times a cached step's matmul
  work and attention over max_len^2 pairs, so long continuations are much slower than cached ones.
  Prompts longer than max_len keep their last max_len tokens.
* "window", relative positions (RoPE, ALiBi, none, and any other encoding without an absolute
  table): attention depends only on distances, so decoding goes on with the KV cache as a ring
  buffer of max_len slots (the model's sliding `window`, capped at max_len): each query attends to
  itself and the max_len - 1 tokens before it, at the cost of a cached step. With one layer this is
  exactly the cropped context; with more, later layers still carry information from before the
  window through earlier layers' keys (as in any sliding-window model, e.g. Mistral).

Generation that fits in max_len ("fits") is untouched by either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.inference.cached_model import inference_config, left_padded_positions
from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model
from tfjax.nn.positions import position_kind

MODES = ("fits", "slide", "window")


def mode(cfg: ModelConfig, longest_prompt: int, max_new_tokens: int) -> str:
  """'fits' when every position a generation needs is < max_len, else 'slide' for absolute
  position encodings and 'window' for the others (module docstring)."""
  if longest_prompt + max_new_tokens <= cfg.max_len:
    return "fits"
  return "slide" if position_kind(cfg).absolute else "window"


def windowed_config(cfg: ModelConfig) -> ModelConfig:
  """The model attending to at most the last max_len tokens (its own window if shorter)."""
  return cfg.replace(window=min(cfg.attention.window or cfg.max_len, cfg.max_len))


def crop_prompts(prompts_BxP: np.ndarray, lengths_B: np.ndarray, max_len: int):
  """Left-padded prompts cut to their last `max_len` tokens (the context a slide keeps)."""
  if prompts_BxP.shape[1] <= max_len:
    return prompts_BxP, lengths_B
  return prompts_BxP[:, -max_len:], np.minimum(lengths_B, max_len).astype(lengths_B.dtype)


def last_window_logits(cfg: ModelConfig, params, prompt_RxP, prompt_lengths_R, generated_RxN,
                       step, encoded_RxSxD=None, encoder_segment_ids_RxS=None):
  """Logits [R, 1, V] for token `step` of every row from a forward pass (no cache) over its last
  max_len tokens at positions 0..max_len-1 (fewer tokens left-padded when the row is shorter).

  prompt_RxP: left-padded prompts; generated_RxN: the tokens chosen so far (columns < step are
  read). Needs padded prompt length P + step > max_len (the window starts at column >= 1 of
  [prompt ; generated]); `step` may be traced.
  """
  window = cfg.max_len
  history_RxT = jnp.concatenate([prompt_RxP, generated_RxN], axis=1)
  start = prompt_RxP.shape[1] + step - window
  tokens_RxL = jax.lax.dynamic_slice_in_dim(history_RxT, start, window, axis=1)
  lengths_R = jnp.minimum(prompt_lengths_R + step, window)
  positions_RxL, segment_ids_RxL = left_padded_positions(lengths_R, window)
  model = build_model(inference_config(cfg))
  if cfg.family == "encoder_decoder":
    logits = model.apply({"params": params}, encoded_RxSxD, tokens_RxL,
                         encoder_segment_ids=encoder_segment_ids_RxS,
                         decoder_segment_ids=segment_ids_RxL, decoder_positions=positions_RxL,
                         method="decode")
  else:
    logits = model.apply({"params": params}, tokens_RxL, segment_ids=segment_ids_RxL,
                         positions=positions_RxL)
  return logits[:, -1:].astype(jnp.float32)
