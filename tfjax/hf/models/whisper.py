"""Whisper (`model_type` whisper) <-> tfjax's Whisper (tfjax/nn/audio.py):
  WhisperForConditionalGeneration   encoder and decoder under `model.`, output tied
  WhisperModel                      the same, unprefixed (its output is the decoder's hidden
                                    state; tfjax's model adds the tied output layer, no weights)
Which one a checkpoint holds is read from its tensor names (`head`); WhisperForAudioClassification
and WhisperForCausalLM are refused by name. Tensor names are the hub's.

The encoder's `embed_positions` is stored in HF checkpoints but is Whisper's fixed sinusoid
table (not trained); import checks it equals `whisper_sinusoids` and export writes it. K
projections have no bias in Whisper: imported as zero biases, left out on export (exact; see
tfjax/nn/audio.py). The output layer is tied to the token embedding (`proj_out` is not stored).
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.models import vit
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.audio import Whisper, WhisperConfig, whisper_sinusoids

MODEL_TYPE = "whisper"
HF_CLASS = "WhisperForConditionalGeneration"
CLASSES = {HF_CLASS: "model.", "WhisperModel": ""}
CONFIG = WhisperConfig
# Fields that do not change the logits of given features and decoder tokens: SpecAugment
# (training-time masking), the audio-classification head, the alignment-heads median filter,
# the generation defaults (read by generate, not by the forward pass), and num_hidden_layers,
# which older configs write as a copy of encoder_layers (the model reads encoder_layers).
IGNORED = frozenset("""
num_hidden_layers
apply_spec_augment mask_time_prob mask_time_length mask_time_min_masks mask_feature_prob
mask_feature_length mask_feature_min_masks use_weighted_layer_sum classifier_proj_size
median_filter_width max_target_positions_for_generation begin_suppress_tokens suppress_tokens
forced_decoder_ids alignment_heads lang_to_id task_to_id no_timestamps_token_id
prev_sot_token_id is_multilingual max_initial_timestamp_index
""".split())
SINUSOID_ATOL = 1e-5


def head(names: set) -> tuple:
  """(transformers class, tensor-name prefix) of `names`, or an UnsupportedError naming the head."""
  for hf_class_, prefix in CLASSES.items():
    if {f"{prefix}encoder.conv1.weight", f"{prefix}decoder.embed_tokens.weight"} <= names:
      return hf_class_, prefix
  if "encoder.conv1.weight" in names:
    raise UnsupportedError("whisper checkpoint of WhisperForAudioClassification (an encoder with "
                           "projector.* / classifier.*): not supported; tfjax imports "
                           f"{sorted(CLASSES)}")
  if "model.decoder.embed_tokens.weight" in names:
    raise UnsupportedError("whisper checkpoint of WhisperForCausalLM (a decoder without its "
                           f"encoder): not supported; tfjax imports {sorted(CLASSES)}")
  raise UnsupportedError(f"whisper checkpoint tensors {sorted(names)[:3]} are not "
                         f"{sorted(CLASSES)}'s (model.encoder.conv1.weight, ...)")


def hf_class(cfg: WhisperConfig) -> str:
  del cfg
  return HF_CLASS


def config_from_hf(f: Fields, names: set) -> WhisperConfig:
  """Absent token ids take WhisperConfig's defaults (decoder start 50257, eos and pad 50256)."""
  del names
  if not f.get("tie_word_embeddings", True):
    raise UnsupportedError("whisper tie_word_embeddings=False is not supported (every released "
                           "Whisper ties proj_out to the token embedding)")
  # transformers defines embed_scale from scale_embedding but never applies it in the forward
  # pass (5.x); every released Whisper has false, so true (meaning unclear) is refused.
  f.expect("scale_embedding", (False,), False)
  return WhisperConfig(
      num_mels=f.require("num_mel_bins"), max_source_positions=f.require("max_source_positions"),
      max_target_positions=f.require("max_target_positions"), vocab_size=f.require("vocab_size"),
      d_model=f.require("d_model"), encoder_layers=f.require("encoder_layers"),
      encoder_heads=f.require("encoder_attention_heads"), encoder_ffn=f.require("encoder_ffn_dim"),
      decoder_layers=f.require("decoder_layers"),
      decoder_heads=f.require("decoder_attention_heads"), decoder_ffn=f.require("decoder_ffn_dim"),
      ffn=vit.activation(f, "activation_function", "gelu"),
      decoder_start_id=f.get("decoder_start_token_id", 50257),
      eos_id=f.get("eos_token_id", 50256), pad_id=f.get("pad_token_id", 50256)).validated()


def config_to_hf(cfg: WhisperConfig) -> dict:
  return dict(model_type=MODEL_TYPE, num_mel_bins=cfg.num_mels,
              max_source_positions=cfg.max_source_positions,
              max_target_positions=cfg.max_target_positions, vocab_size=cfg.vocab_size,
              d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
              encoder_attention_heads=cfg.encoder_heads, encoder_ffn_dim=cfg.encoder_ffn,
              decoder_layers=cfg.decoder_layers, decoder_attention_heads=cfg.decoder_heads,
              decoder_ffn_dim=cfg.decoder_ffn, activation_function=vit.ACT_NAMES[cfg.ffn],
              scale_embedding=False, decoder_start_token_id=cfg.decoder_start_id,
              eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id, tie_word_embeddings=True,
              begin_suppress_tokens=None,
              suppress_tokens=None)


def conv(hf: str, path: tuple) -> mapping.Rule:
  """torch Conv1d weight [out, in, k] <-> flax Conv kernel [k, in, out]."""
  return mapping.Rule((hf,), (path,), lambda a: [np.asarray(a[0]).transpose(2, 1, 0)],
                      lambda a: [np.asarray(a[0]).transpose(2, 1, 0)])


def zero_bias(path: tuple, heads: int, d_model: int) -> mapping.Rule:
  """A tfjax K bias with no HF tensor: zeros on import, dropped on export (module docstring)."""
  return mapping.Rule((), (path,), lambda a: [np.zeros((heads, d_model // heads), np.float32)],
                      lambda a: [])


def attention_rules(hf: str, path: tuple, heads: int, d_model: int) -> list:
  out = [mapping.heads_in(f"{hf}k_proj.weight", path + ("key", "kernel"), heads),
         zero_bias(path + ("key", "bias"), heads, d_model)]
  for short, name in (("q", "query"), ("v", "value")):
    out += [mapping.heads_in(f"{hf}{short}_proj.weight", path + (name, "kernel"), heads),
            mapping.heads_bias(f"{hf}{short}_proj.bias", path + (name, "bias"), heads)]
  return out + [mapping.heads_out(f"{hf}out_proj.weight", path + ("out", "kernel"), heads),
                mapping.copy(f"{hf}out_proj.bias", path + ("out", "bias"))]


def _layer(hf: str, tj: tuple, heads: int, d_model: int, cross: bool) -> list:
  out = attention_rules(f"{hf}self_attn.", tj + ("self_attention",), heads, d_model)
  out += vit.norm_rules(f"{hf}self_attn_layer_norm", tj + ("self_attention_norm",))
  if cross:
    out += attention_rules(f"{hf}encoder_attn.", tj + ("cross_attention",), heads, d_model)
    out += vit.norm_rules(f"{hf}encoder_attn_layer_norm", tj + ("cross_attention_norm",))
  for short, name in (("fc1", "wi"), ("fc2", "wo")):
    out += [mapping.linear(f"{hf}{short}.weight", tj + ("ffn", name, "kernel")),
            mapping.copy(f"{hf}{short}.bias", tj + ("ffn", name, "bias"))]
  return out + vit.norm_rules(f"{hf}final_layer_norm", tj + ("ffn_norm",))


def rules(cfg: WhisperConfig, prefix: str | None = None) -> list:
  pre = CLASSES[HF_CLASS] if prefix is None else prefix
  e, d = f"{pre}encoder.", f"{pre}decoder."
  out = [conv(f"{e}conv1.weight", ("conv1", "kernel")), mapping.copy(f"{e}conv1.bias",
                                                                       ("conv1", "bias")),
         conv(f"{e}conv2.weight", ("conv2", "kernel")), mapping.copy(f"{e}conv2.bias",
                                                                       ("conv2", "bias"))]
  for i in range(cfg.encoder_layers):
    out += _layer(f"{e}layers.{i}.", ("encoder", f"layers_{i}"), cfg.encoder_heads, cfg.d_model,
                  False)
  out += vit.norm_rules(f"{e}layer_norm", ("encoder", "final_norm"))
  out += [mapping.copy(f"{d}embed_tokens.weight", ("tokens", "embedding")),
          mapping.copy(f"{d}embed_positions.weight", ("decoder_positions",))]
  for i in range(cfg.decoder_layers):
    out += _layer(f"{d}layers.{i}.", ("decoder", f"layers_{i}"), cfg.decoder_heads, cfg.d_model,
                  True)
  return out + vit.norm_rules(f"{d}layer_norm", ("decoder", "final_norm"))


SINUSOIDS = "encoder.embed_positions.weight"  # under the class's prefix


def droppable(cfg: WhisperConfig, name: str) -> bool:
  """The encoder's sinusoid table (checked by check_derived) and the tied proj_out."""
  del cfg
  return name in (SINUSOIDS, "model." + SINUSOIDS, "proj_out.weight")


def check_derived(cfg: WhisperConfig, ckpt) -> None:
  """The stored encoder positions are Whisper's sinusoids (tfjax computes them)."""
  stored_names = [n for n in (SINUSOIDS, "model." + SINUSOIDS) if n in ckpt.names]
  if not stored_names:
    return
  name = stored_names[0]
  stored = np.asarray(ckpt.get(name), np.float32)
  want = whisper_sinusoids(cfg.max_source_positions, cfg.d_model)
  if stored.shape != want.shape or not np.allclose(stored, want, atol=SINUSOID_ATOL):
    raise UnsupportedError(f"{name} is not Whisper's sinusoid table (shape {stored.shape}"
                           "); tfjax computes the encoder positions and cannot import trained "
                           "ones")


def derived_tensors(cfg: WhisperConfig, prefix: str | None = None) -> dict:
  """The sinusoid table transformers stores (float32 rounding of the same formula: an import
  keeps the source's own table, so its export reproduces it bit for bit)."""
  pre = CLASSES[HF_CLASS] if prefix is None else prefix
  return {pre + SINUSOIDS: whisper_sinusoids(cfg.max_source_positions, cfg.d_model)}


def model(cfg: WhisperConfig):
  return Whisper(cfg)


def example_inputs(cfg: WhisperConfig) -> tuple:
  return (np.zeros((1, cfg.num_frames, cfg.num_mels), np.float32), np.zeros((1, 1), np.int32))
