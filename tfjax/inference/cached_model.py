"""The model with its KV cache: the configs generation runs under, the empty cache, the encoder
pass, and the cached forward pass that prefill and every step call.

The cache itself (its slots, ring buffer and cross-attention keys) is tfjax/nn/kv_cache.py; this
module only sizes it and threads it through `model.apply`. Shape letters as in tfjax/nn/axes.py
(S: encoder length).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model


def inference_config(model_config: ModelConfig) -> ModelConfig:
  """No dropout and no remat (there is no backward pass); parameters are unchanged by either."""
  return model_config.replace(deterministic=True, remat="none", decode=False)


def decode_config(model_config: ModelConfig) -> ModelConfig:
  """The inference config with the KV cache on (decode=True), attending through the XLA reference:
  cached attention masks by each slot's absolute position (q_positions / kv_positions), which the
  fused kernels do not take, and a step's one query leaves them nothing to fuse."""
  return inference_config(model_config).replace(decode=True, attention_impl="xla")


def init_cache(model_config: ModelConfig, batch: int, max_len: int,
               encoder_len: Optional[int] = None):
  """The empty 'cache' collection for `batch` rows of up to `max_len` tokens (prompt + new).

  With a sliding window the self-attention caches hold only `window` slots (a ring buffer); with
  a window_pattern only the sliding layers' caches do.
  Encoder-decoder models also need `encoder_len`, the (padded) encoder length.
  """
  cfg = decode_config(model_config)
  if cfg.family == "encoder":
    raise ValueError("model.family='encoder' is bidirectional and cannot generate")
  if cfg.family == "encoder_decoder" and encoder_len is None:
    raise ValueError("an encoder_decoder cache needs encoder_len (the padded encoder length)")
  # The cache is sized by the dummy input; a window caps it, so never trace a longer dummy (unless
  # global layers of a window_pattern need the full length; their sliding layers cap their own).
  sliding_only = cfg.attention.window is not None and cfg.attention.window_pattern is None
  length = min(max_len, cfg.attention.window) if sliding_only else max_len
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
  cfg = decode_config(model_config)
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


def left_padded_positions(lengths_B, padded_len: int):
  """(positions, segment_ids) [B, P] of left-padded prompts: tokens at 0..len-1, pads 0 / id 0."""
  offset_BxP = jnp.arange(padded_len, dtype=jnp.int32)[None, :] - (padded_len - lengths_B)[:, None]
  return jnp.maximum(offset_BxP, 0), (offset_BxP >= 0).astype(jnp.int32)
