"""Whisper (Radford et al. 2022): a speech encoder-decoder over tfjax's pre-LN blocks.

  encoder  log-mel features [B, T, M] -> conv1d(k 3, pad 1) -> GELU -> conv1d(k 3, stride 2,
           pad 1) -> GELU  [B, T/2, D] -> + sinusoids [T/2, D] -> pre-LN layers -> final norm
  decoder  tokens [B, L] -> embedding + learned positions
           -> pre-LN layers (causal self-attention, cross-attention, FFN) -> final norm
           -> tied output layer h E^T
Whisper's sinusoids (`whisper_sinusoids`) differ from Vaswani et al.'s: channel i < D/2 holds
sin(p w_i) and channel D/2 + i cos(p w_i), with w_i = 10000^(-i / (D/2 - 1)) (the last
frequency is exactly 1/10000, where tfjax/nn/positions.py's `halves` layout has 10000^(-2i/D)).
Whisper's K projections have no bias: tfjax's blocks give K a bias, imported as zeros and left
out on export, which is exact: q.b_K adds one constant to a query's scores over every key, and
softmax cancels it (tests/modalities/test_whisper.py checks the output is unchanged).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig
from tfjax.nn.ffn import gelu
from tfjax.nn.layers import LayerStack


def whisper_sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
  """[length, channels] float32: sin | cos halves at w_i = max_timescale^(-i / (channels/2 - 1))."""
  if channels % 2 or channels < 4:
    raise ValueError(f"whisper d_model={channels} must be even and >= 4 for its sinusoids")
  increment = np.log(max_timescale) / (channels // 2 - 1)
  inv_timescales = np.exp(-increment * np.arange(channels // 2, dtype=np.float32))
  scaled_time = np.arange(length, dtype=np.float32)[:, None] * inv_timescales[None, :]
  return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class WhisperConfig:
  """num_mels (input channels), max_source_positions (encoder frames after the stride-2 conv:
  inputs have 2x this many frames), max_target_positions (decoder position table), vocab_size,
  d_model; encoder_/decoder_ layers, heads, ffn dims; ffn activation (gelu); decoder_start_id
  (the first decoder input), eos_id (where greedy decoding stops) and pad_id (HF's padding_idx:
  it changes neither the forward pass nor decoding, kept for export)."""
  num_mels: int = 16
  max_source_positions: int = 32
  max_target_positions: int = 16
  vocab_size: int = 32
  d_model: int = 64
  encoder_layers: int = 2
  encoder_heads: int = 4
  encoder_ffn: int = 128
  decoder_layers: int = 2
  decoder_heads: int = 4
  decoder_ffn: int = 128
  ffn: str = "gelu"
  decoder_start_id: int = 1
  eos_id: int = 2
  pad_id: int = 0
  init_std: float = 0.02
  dtype: str = "float32"
  attention_impl: str = "xla"

  @property
  def num_frames(self) -> int:
    return 2 * self.max_source_positions

  def _blocks(self, layers: int, heads: int, d_ff: int, max_len: int) -> ModelConfig:
    return ModelConfig.from_flat(dict(
        family="encoder_decoder", vocab_size=self.vocab_size, d_model=self.d_model,
        num_layers=layers, num_heads=heads, d_ff=d_ff, ffn=self.ffn, ffn_bias=True,
        attention_bias=True, norm="layernorm", norm_eps=1e-5, norm_placement="pre",
        position="none", max_len=max_len, init_std=self.init_std, dtype=self.dtype,
        attention_impl=self.attention_impl)).validated()

  def encoder_blocks(self) -> ModelConfig:
    return self._blocks(self.encoder_layers, self.encoder_heads, self.encoder_ffn,
                        self.max_source_positions)

  def decoder_blocks(self) -> ModelConfig:
    return self._blocks(self.decoder_layers, self.decoder_heads, self.decoder_ffn,
                        self.max_target_positions)

  def validated(self) -> "WhisperConfig":
    self.encoder_blocks()
    self.decoder_blocks()
    whisper_sinusoids(1, self.d_model)
    for key in ("decoder_start_id", "eos_id", "pad_id"):
      if not 0 <= getattr(self, key) < self.vocab_size:
        raise ValueError(f"whisper {key}={getattr(self, key)} is not a token id of the "
                         f"vocabulary of {self.vocab_size}")
    return self


class Whisper(nn.Module):
  """(features [B, 2 * max_source_positions, num_mels], decoder tokens [B, L]) -> logits
  [B, L, vocab] (float32); `encode` and `decode` run the halves."""
  config: WhisperConfig

  def setup(self):
    cfg = self.config
    enc, dec = cfg.encoder_blocks(), cfg.decoder_blocks()
    init = nn.initializers.normal(cfg.init_std)
    logical = nn.with_logical_partitioning  # every parameter's axes (tfjax/nn/axes.py)
    conv_kernel = logical(init, (None, None, axes.EMBED))
    conv_bias = logical(nn.initializers.zeros, (axes.EMBED,))
    # Convolutions over time, channels last: kernel [3, in, out].
    self.conv1 = nn.Conv(cfg.d_model, (3,), padding=((1, 1),), dtype=enc.compute_dtype,
                         kernel_init=conv_kernel, bias_init=conv_bias)
    self.conv2 = nn.Conv(cfg.d_model, (3,), strides=(2,), padding=((1, 1),),
                         dtype=enc.compute_dtype, kernel_init=conv_kernel, bias_init=conv_bias)
    self.encoder = LayerStack(enc, cfg.encoder_layers)
    self.tokens = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=dec.compute_dtype,
                           embedding_init=logical(init, (axes.VOCAB, axes.EMBED)))
    self.decoder_positions = self.param("decoder_positions", logical(init, (None, axes.EMBED)),
                                        (cfg.max_target_positions, cfg.d_model))
    self.decoder = LayerStack(dec, cfg.decoder_layers, causal=True, cross_attention=True)

  def encode(self, features_BxTxM):
    cfg = self.config
    if tuple(features_BxTxM.shape[1:]) != (cfg.num_frames, cfg.num_mels):
      raise ValueError(f"features of shape {tuple(features_BxTxM.shape)}: this model reads "
                       f"[batch, {cfg.num_frames}, {cfg.num_mels}] (2 x max_source_positions "
                       "frames, as Whisper pads every input to 30 s); pad or crop the features")
    x_BxTxD = gelu(self.conv1(features_BxTxM))
    x_BxSxD = gelu(self.conv2(x_BxTxD))  # S = T / 2
    table_SxD = whisper_sinusoids(cfg.max_source_positions, cfg.d_model)
    return self.encoder(x_BxSxD + table_SxD.astype(x_BxSxD.dtype))

  def decode(self, encoded_BxSxD, tokens_BxL):
    cfg = self.config
    length = tokens_BxL.shape[1]
    if length > cfg.max_target_positions:
      raise ValueError(f"decoder length {length} exceeds max_target_positions="
                       f"{cfg.max_target_positions}")
    x_BxLxD = self.tokens(tokens_BxL)
    x_BxLxD = x_BxLxD + self.decoder_positions[:length].astype(x_BxLxD.dtype)
    h_BxLxD = self.decoder(x_BxLxD, None, None, encoded_BxSxD)
    return self.tokens.attend(h_BxLxD).astype(jnp.float32)

  def __call__(self, features_BxTxM, tokens_BxL):
    return self.decode(self.encode(features_BxTxM), tokens_BxL)


def greedy_decode(config: WhisperConfig, params, features_BxTxM, max_new_tokens: int,
                  prompt_BxP=None, suppress_tokens=(), begin_suppress_tokens=()):
  """Greedy tokens [B, P + max_new_tokens] from the prompt (default: decoder_start_id); a row
  that emitted eos_id continues with eos_id, as transformers' generate pads finished rows.

  `suppress_tokens` are never generated and `begin_suppress_tokens` not as the first new token
  (transformers' SuppressTokens / SuppressTokensAtBegin processors): pass a released model's
  generation lists to get its `generate` tokens.

  Each step reruns the decoder over a fixed-length buffer: the causal mask keeps position t
  blind to the later (placeholder) positions, so one compiled program serves every step."""
  for name, ids in (("suppress_tokens", suppress_tokens),
                    ("begin_suppress_tokens", begin_suppress_tokens)):
    bad = [i for i in ids if not 0 <= int(i) < config.vocab_size]
    if bad:
      raise ValueError(f"{name} {bad} are not token ids of the vocabulary "
                       f"(0..{config.vocab_size - 1})")
  banned_V = jnp.zeros((config.vocab_size,), bool).at[jnp.asarray(
      list(suppress_tokens), jnp.int32)].set(True)
  banned_first_V = banned_V.at[jnp.asarray(list(begin_suppress_tokens), jnp.int32)].set(True)
  model = Whisper(config)
  batch = features_BxTxM.shape[0]
  if prompt_BxP is None:
    prompt_BxP = jnp.full((batch, 1), config.decoder_start_id, jnp.int32)
  start = prompt_BxP.shape[1]
  total = start + max_new_tokens
  if total > config.max_target_positions:
    raise ValueError(f"prompt {start} + max_new_tokens {max_new_tokens} exceeds "
                     f"max_target_positions={config.max_target_positions}")
  encoded = model.apply({"params": params}, features_BxTxM, method=Whisper.encode)
  buffer_BxN = jnp.concatenate(
      [prompt_BxP.astype(jnp.int32), jnp.full((batch, max_new_tokens), config.eos_id,
                                              jnp.int32)], axis=1)

  def step(t, state):
    buffer, done = state
    logits = model.apply({"params": params}, encoded, buffer, method=Whisper.decode)
    logits_BxV = jax.lax.dynamic_index_in_dim(logits, t - 1, axis=1, keepdims=False)
    banned = jnp.where(t == start, banned_first_V, banned_V)
    token = jnp.argmax(jnp.where(banned, -jnp.inf, logits_BxV), -1)
    token = jnp.where(done, config.eos_id, token).astype(jnp.int32)
    buffer = jax.lax.dynamic_update_slice_in_dim(buffer, token[:, None], t, axis=1)
    return buffer, done | (token == config.eos_id)

  buffer, _ = jax.lax.fori_loop(start, total, step,
                                (buffer_BxN, jnp.zeros((batch,), bool)))
  return buffer
