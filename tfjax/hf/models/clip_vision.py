"""CLIP's vision tower alone (`model_type` clip_vision_model): CLIPVisionModel <-> a tfjax
ViTClassifier (tfjax/nn/vision.py) with CLIP's switches (pre_norm, no patch bias, no head).

transformers 5 saves CLIPVisionModel's tensors unprefixed (embeddings.*, encoder.*,
pre_layrnorm, post_layernorm); older versions under `vision_model.`; both are read, and export
writes the prefix the import read (or transformers 5's). The pooled output (post_layernorm of
token 0) is tfjax's `pooled`; transformers' last_hidden_state is before that norm, tfjax's
`hidden` after it. CLIPVisionModelWithProjection (visual_projection) is refused by name.
"""

from __future__ import annotations

from tfjax.hf.models import clip, vit
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.vision import ViTClassifier, ViTConfig

MODEL_TYPE = "clip_vision_model"
HF_CLASS = "CLIPVisionModel"
CONFIG = ViTConfig
CLASSES = {HF_CLASS: ""}
# projection_dim is read by CLIPVisionModelWithProjection only (refused by tensor name); the
# rest as for CLIPModel's vision_config.
IGNORED = clip.SUB_IGNORED


def head(names: set) -> tuple:
  if "visual_projection.weight" in names:
    raise UnsupportedError("clip_vision_model checkpoint of CLIPVisionModelWithProjection "
                           "(visual_projection.weight): not supported; tfjax imports "
                           "CLIPVisionModel, or the whole CLIPModel")
  for prefix in ("", "vision_model."):
    if f"{prefix}embeddings.class_embedding" in names:
      return HF_CLASS, prefix
  raise UnsupportedError(f"clip_vision_model checkpoint tensors {sorted(names)[:3]} are not "
                         "CLIPVisionModel's (embeddings.class_embedding, encoder.layers.*)")


def hf_class(cfg: ViTConfig) -> str:
  del cfg
  return HF_CLASS


def config_from_hf(f: Fields, names: set) -> ViTConfig:
  del names
  f.expect("is_decoder", (False,), False)
  f.expect("add_cross_attention", (False,), False)
  return clip.vision_from_fields(f).validated()


def config_to_hf(cfg: ViTConfig) -> dict:
  if cfg.num_classes or cfg.pooler or not cfg.pre_norm or cfg.patch_bias:
    raise UnsupportedError("CLIPVisionModel is a ViT with pre_norm=True, patch_bias=False, "
                           "num_classes=0 and pooler=False; this config differs")
  return clip.vision_to_hf(cfg)


def rules(cfg: ViTConfig, prefix: str | None = None) -> list:
  return clip.vision_rules(cfg, "" if prefix is None else prefix)


def droppable(cfg: ViTConfig, name: str) -> bool:
  return clip.droppable(cfg, name)


def model(cfg: ViTConfig):
  return ViTClassifier(cfg)


def example_inputs(cfg: ViTConfig) -> tuple:
  return vit.example_inputs(cfg)
