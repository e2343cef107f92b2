"""The three model families, selected by `model.family`, and `build_model`.

  decoder          GPT / LLaMA causal LM:   (inputs_BxL) -> logits_BxLxV
  encoder          BERT:                    (inputs_BxL) -> {'mlm_logits', 'class_logits', ...}
  encoder_decoder  Transformer / T5:        (encoder_inputs_BxS, decoder_inputs_BxL) -> logits_BxLxV
                   decoder inputs are the targets shifted right (see `shift_right`).
Shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig
from tfjax.nn.ffn import ACTIVATIONS, dense
from tfjax.nn.layers import LayerStack
from tfjax.nn.masks import default_positions
from tfjax.nn.norms import Norm
from tfjax.nn.ops import softcap_logits
from tfjax.nn.positions import position_kind


def shift_right(targets_BxL, bos_id: int):
  """Teacher forcing: decoder input at t is the target at t-1, starting from BOS."""
  return jnp.concatenate(
      [jnp.full_like(targets_BxL[:, :1], bos_id), targets_BxL[:, :-1]], axis=1)


def token_embedding(cfg: ModelConfig, name: Optional[str] = None) -> nn.Embed:
  """The [vocab, d_model] token table. With sqrt(d_model) scaling the table starts at std
  d^-0.5, so scaled inputs have unit scale."""
  std = cfg.d_model ** -0.5 if cfg.embed_scale else cfg.init_std
  return nn.Embed(
      cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, name=name,
      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(std),
                                                  (axes.VOCAB, axes.EMBED)))


def lookup(table: nn.Embed, ids, dtype):
  """Rows `ids` of an Embed's table, cast to `dtype` after the gather (nn.Embed casts the whole
  table first): the same values, but the gradient, a scatter-add of one row per token, then
  accumulates in the table's float32 rather than in a bfloat16 copy, where many tokens of one id
  round away each other's updates."""
  return jnp.take(table.embedding, ids, axis=0).astype(dtype)


class Embedder(nn.Module):
  """Token embedding (+ absolute positions, token types), scaling, optional norm, dropout.

  `attend` is the tied output projection: logits = h E^T. `shared_tokens` is a token table owned
  by the parent (BART: one table, separate encoder and decoder positions); None = its own.
  """
  config: ModelConfig
  shared_tokens: Optional[nn.Module] = None

  def setup(self):
    cfg = self.config
    if self.shared_tokens is None:
      self.tokens = token_embedding(cfg)
    position_embedding = position_kind(cfg).embedding
    if position_embedding is not None:
      self.positions = position_embedding(cfg)
    if cfg.type_vocab_size:
      self.token_types = nn.Embed(
          cfg.type_vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
          embedding_init=nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std),
                                                      (None, axes.EMBED)))
    if cfg.embed_norm:
      self.norm = Norm(cfg)
    self.dropout = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)

  def _tokens(self) -> nn.Module:
    return self.tokens if self.shared_tokens is None else self.shared_tokens

  def __call__(self, inputs_BxL, positions_BxL, token_type_ids=None):
    cfg = self.config
    x_BxLxD = lookup(self._tokens(), inputs_BxL, cfg.compute_dtype)
    if cfg.embed_scale:
      x_BxLxD = x_BxLxD * jnp.sqrt(float(cfg.d_model)).astype(x_BxLxD.dtype)
    if position_kind(cfg).embedding is not None:  # absolute positions (learned, sinusoidal)
      positions_BxLxD = self.positions(positions_BxL, inputs_BxL.shape[1])
      x_BxLxD = x_BxLxD + positions_BxLxD.astype(x_BxLxD.dtype)
    if cfg.type_vocab_size:
      types = jnp.zeros_like(inputs_BxL) if token_type_ids is None else token_type_ids
      x_BxLxD = x_BxLxD + lookup(self.token_types, types, cfg.compute_dtype)
    if cfg.embed_norm:
      x_BxLxD = self.norm(x_BxLxD)
    x_BxLxD = self.dropout(x_BxLxD)
    return nn.with_logical_constraint(x_BxLxD, axes.RESIDUAL_STREAM)

  def attend(self, x_BxLxD):
    return self._tokens().attend(x_BxLxD)


def _positions(inputs_BxL, positions_BxL):
  """The given positions, else each row's tokens at 0..L-1."""
  if positions_BxL is not None:
    return positions_BxL
  batch, length = inputs_BxL.shape
  return default_positions(length, batch=batch)


_LOGITS_AXES = (axes.BATCH, axes.LENGTH, axes.VOCAB)


def _lm_logits(cfg: ModelConfig, embedder: Embedder, h_BxLxD, lm_head=None, bias=None):
  """Output projection in float32 (logits feed a softmax over the whole vocabulary), plus `bias`
  [V], then soft-capped by model.logits_softcap (Gemma 2). `lm_head` is the untied projection
  (created here when None)."""
  if cfg.tie_embeddings:
    if cfg.scale_tied_logits:  # T5 v1.0
      h_BxLxD = h_BxLxD * jnp.asarray(cfg.d_model ** -0.5, h_BxLxD.dtype)
    logits = embedder.attend(h_BxLxD)
  else:
    if lm_head is None:
      lm_head = dense(cfg, cfg.vocab_size, (axes.EMBED, axes.VOCAB), "lm_head", False)
    logits = lm_head(h_BxLxD)
  logits = logits.astype(jnp.float32)
  if bias is not None:
    logits = logits + bias
  if cfg.logits_softcap is not None:
    logits = softcap_logits(logits, cfg.logits_softcap)
  return nn.with_logical_constraint(logits, _LOGITS_AXES)


class DecoderLM(nn.Module):
  """GPT / LLaMA: embeddings -> causal decoder-only blocks -> (tied) LM head."""
  config: ModelConfig

  @nn.compact
  def __call__(self, inputs_BxL, *, segment_ids=None, positions=None):
    cfg = self.config
    embedder = Embedder(cfg, name="embed")
    positions = _positions(inputs_BxL, positions)
    x_BxLxD = embedder(inputs_BxL, positions)
    x_BxLxD = LayerStack(cfg, cfg.num_layers, causal=True, name="decoder")(
        x_BxLxD, segment_ids, positions)
    bias = None
    if cfg.final_logits_bias:
      bias = self.param("final_logits_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, (axes.VOCAB,)), (cfg.vocab_size,))
    return _lm_logits(cfg, embedder, x_BxLxD, bias=bias)


class Encoder(nn.Module):
  """BERT: embeddings (+ token types) -> bidirectional layers -> MLM head / pooler / classifier.

  Returns a dict with 'hidden' always, 'mlm_logits' if model.mlm_head, 'pooled' if model.pooler
  and 'class_logits' if model.num_classes.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, inputs_BxL, *, segment_ids=None, positions=None, token_type_ids=None):
    cfg = self.config
    embedder = Embedder(cfg, name="embed")
    x_BxLxD = embedder(inputs_BxL, _positions(inputs_BxL, positions), token_type_ids)
    h_BxLxD = LayerStack(cfg, cfg.num_layers, name="encoder")(
        x_BxLxD, segment_ids, _positions(inputs_BxL, positions))
    out = {"hidden": h_BxLxD}
    if cfg.mlm_head:
      t_BxLxD = dense(cfg, cfg.d_model, (axes.EMBED, axes.MLP), "mlm_transform", True)(h_BxLxD)
      t_BxLxD = Norm(cfg, name="mlm_norm")(ACTIVATIONS[cfg.mlm_activation](t_BxLxD))
      bias = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 (axes.VOCAB,)), (cfg.vocab_size,))
      out["mlm_logits"] = _lm_logits(cfg, embedder, t_BxLxD, bias=bias)
    if cfg.pooler:
      # BERT pools the first ([CLS]) token.
      pooled = jnp.tanh(dense(cfg, cfg.d_model, (axes.EMBED, axes.MLP), "pooler", True)(
          h_BxLxD[:, 0]))
      out["pooled"] = pooled
      if cfg.num_classes:
        pooled = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)(pooled)
        out["class_logits"] = dense(cfg, cfg.num_classes, (axes.EMBED, None), "classifier",
                                    True)(pooled).astype(jnp.float32)
    return out


class EncoderDecoder(nn.Module):
  """Vaswani et al. / T5: encoder, decoder with cross-attention, shared (tied) embeddings.

  Embedding parameters by model.share_embeddings / share_positions:
    both shared (default):   `embed` serves encoder and decoder
    tokens only (BART):      `shared` token table; `encoder_embed`, `decoder_embed` hold each
                             side's positions and embedding norm
    none (Marian, separate): `encoder_embed`, `decoder_embed` each with its own token table
  The tied output layer reads the decoder's token table.
  """
  config: ModelConfig

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings and cfg.shares_positions:
      self.embed = Embedder(cfg)
      self.encoder_embedder = self.decoder_embedder = self.embed
    else:
      shared = token_embedding(cfg, name="shared") if cfg.share_embeddings else None
      self.encoder_embedder = Embedder(cfg, shared_tokens=shared, name="encoder_embed")
      self.decoder_embedder = Embedder(cfg, shared_tokens=shared, name="decoder_embed")
    if cfg.final_logits_bias:
      self.final_logits_bias = self.param(
          "final_logits_bias", nn.with_logical_partitioning(nn.initializers.zeros, (axes.VOCAB,)),
          (cfg.vocab_size,))
    self.encoder = LayerStack(cfg, cfg.num_layers)
    self.decoder = LayerStack(cfg, cfg.decoder_layers, causal=True, cross_attention=True)
    if not cfg.tie_embeddings:
      self.lm_head = dense(cfg, cfg.vocab_size, (axes.EMBED, axes.VOCAB), "lm_head", False)

  def encode(self, encoder_inputs_BxS, encoder_segment_ids=None):
    positions = _positions(encoder_inputs_BxS, None)
    x_BxSxD = self.encoder_embedder(encoder_inputs_BxS, positions)
    return self.encoder(x_BxSxD, encoder_segment_ids, positions)

  def decode(self, encoded_BxSxD, decoder_inputs_BxL, *, encoder_segment_ids=None,
             decoder_segment_ids=None, decoder_positions=None):
    """encoded may be None when decoding with a cache whose cross K/V are already filled."""
    positions = _positions(decoder_inputs_BxL, decoder_positions)
    x_BxLxD = self.decoder_embedder(decoder_inputs_BxL, positions)
    h_BxLxD = self.decoder(x_BxLxD, decoder_segment_ids, positions, encoded_BxSxD,
                           encoder_segment_ids)
    cfg = self.config
    return _lm_logits(cfg, self.decoder_embedder, h_BxLxD,
                      None if cfg.tie_embeddings else self.lm_head,
                      self.final_logits_bias if cfg.final_logits_bias else None)

  def __call__(self, encoder_inputs_BxS, decoder_inputs_BxL, *, encoder_segment_ids=None,
               decoder_segment_ids=None, decoder_positions=None):
    encoded = self.encode(encoder_inputs_BxS, encoder_segment_ids)
    return self.decode(encoded, decoder_inputs_BxL, encoder_segment_ids=encoder_segment_ids,
                       decoder_segment_ids=decoder_segment_ids,
                       decoder_positions=decoder_positions)


_FAMILIES = {"decoder": DecoderLM, "encoder": Encoder, "encoder_decoder": EncoderDecoder}


def build_model(model_config) -> nn.Module:
  """A model from `config.model` (ConfigDict, dict or ModelConfig), validated first."""
  cfg = model_config if isinstance(model_config, ModelConfig) else ModelConfig.from_config(
      model_config)
  return _FAMILIES[cfg.family](cfg.validated())
