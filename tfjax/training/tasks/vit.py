"""Image classification with ViT (tfjax/nn/vision.py): config.task='vit'.

Batch: images [B, H, W, C] float32, labels [B] int32. Scored as one prediction per row (cross
entropy of the class logits; accuracy, chance 1/classes). Synthetic data (data.name='synthetic'):
oriented gratings of data.classes classes with noise std data.noise
(tfjax/modalities/synthetic.py `stripes`). A prepared image folder (data.name='image_folder',
data.path = tfjax-prepare --input=images:DIR's output): its train split, evaluated on its
held-out split (tfjax/training/tasks/prepared_rows.py), pixels scaled to [-1, 1].
"""

from __future__ import annotations

import numpy as np

from tfjax.modalities import synthetic
from tfjax.nn.vision import ViTClassifier, ViTConfig
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.prepared_rows import PreparedRows, open_prepared
from tfjax.training.tasks.registry import register_dataset, register_task
from tfjax.training.tasks.text import class_statistics


class ViTTask(OwnModelTask):
  name = family = "vit"
  config_class = ViTConfig

  def data_section(self) -> dict:
    return {"classes": 4, "noise": 0.5}

  def check(self, config, model_cfg) -> None:
    if config.data.name == "synthetic" and model_cfg.num_classes != config.data.classes:
      raise ValueError(f"config.model.num_classes={model_cfg.num_classes} differs from "
                       f"config.data.classes={config.data.classes}; set them equal")

  def build_model(self, model_cfg, deterministic: bool = True):
    return ViTClassifier(model_cfg)

  def example_batch(self, model_cfg):
    c = model_cfg
    return {"images": np.zeros((1, c.image_size, c.image_size, c.channels), np.float32)}

  def model_inputs(self, batch):
    return (batch["images"],), {}

  def row_lengths(self, batch):
    return 1, None

  def tokens_per_row(self, model_cfg, batch) -> int:
    return model_cfg.num_patches + 1

  def train_flops_per_row(self, model_cfg, batch) -> float:
    return vit_train_flops_per_row(model_cfg)

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    logits_BxC = model.apply({"params": params}, batch["images"], rngs=rngs or {})["logits"]
    return class_statistics(logits_BxC, batch["labels"], batch.get("weights"), label_smoothing)


def vit_train_flops_per_row(cfg: ViTConfig) -> float:
  """Training FLOPs of one image: 6 per weight per position it multiplies (forward 2, backward
  4), plus the encoder's attention scores and values, as tfjax/training/accounting/flops.py counts a
  text encoder. The patch projection runs on the N patches, the norms and layers on N + 1 tokens
  ([CLS] first), the pooler and classifier on [CLS] alone; [CLS] and the position table are
  added, not multiplied."""
  # Deferred: flops imports the models.
  from tfjax.training.accounting import flops  # pylint: disable=import-outside-toplevel
  blocks, d = cfg.blocks(), cfg.d_model
  patches, tokens = cfg.num_patches, cfg.num_patches + 1
  # blocks() has a 1-row token table that flops.py would count as a tied output layer; a ViT
  # has none (its patch projection is counted below)
  table = blocks.vocab_size * d if blocks.tie_embeddings else 0
  per_token = flops.flops_per_token(blocks, tokens) - 6.0 * table
  patch_embed = cfg.patch_size ** 2 * cfg.channels * d + (d if cfg.patch_bias else 0)
  pre_norm = 2 * d if cfg.pre_norm else 0  # LayerNorm scale and bias
  head = (d * d + d if cfg.pooler else 0) + (d * cfg.num_classes + cfg.num_classes)
  return (6.0 * (patch_embed * patches + pre_norm * tokens + head)
          + per_token * tokens)


def synthetic_images(config, workdir=None):
  del workdir
  cfg, data = ViTTask().model_config(config), config.data

  def rows(rng, count):
    images, labels = synthetic.stripes(rng, count, cfg.image_size, cfg.channels, data.classes,
                                       data.noise)
    return {"images": images, "labels": labels}
  return SyntheticRows(rows, data.seed, data.eval_seed)


def scaled_pixels(pixels_BxHxWxC) -> np.ndarray:
  """uint8 pixels -> float32 in [-1, 1] (mean 0.5, std 0.5: the ViT / CLIP-style scaling)."""
  return pixels_BxHxWxC.astype(np.float32) / 127.5 - 1.0


CHANNELS = {"RGB": 3, "L": 1}


def check_image_settings(settings: dict, image_size: int, channels: int, path: str,
                         section: str = "config.model") -> None:
  """The prepared images fit the model's input; else a one-line error naming both."""
  found = (settings["size"], CHANNELS[settings["mode"]])
  if found != (image_size, channels):
    raise ValueError(f"data.path={path} holds {found[0]}x{found[0]} {settings['mode']} images "
                     f"({found[1]} channels), {section} reads {image_size}x{image_size} with "
                     f"{channels} channels: set {section}.image_size={found[0]} and "
                     f"channels={found[1]}, or prepare with --image_size={image_size}")


def image_folder(config, workdir=None):
  del workdir
  cfg = ViTTask().model_config(config)
  train, held_out = open_prepared(config, "image", "image_folder")
  check_image_settings(train.settings, cfg.image_size, cfg.channels, config.data.path)
  if cfg.num_classes != len(train.class_names):
    raise ValueError(f"config.model.num_classes={cfg.num_classes}, data.path={config.data.path} "
                     f"holds {len(train.class_names)} classes: set model.num_classes="
                     f"{len(train.class_names)}")

  def rows(split, indices, positions):
    del positions
    return {"images": scaled_pixels(split.pixels(indices)), "labels": split.labels(indices)}
  return PreparedRows(train, held_out, config.data.seed, config.data.eval_seed, rows)


register_task(ViTTask())
register_dataset("vit", "synthetic", synthetic_images)
register_dataset("vit", "image_folder", image_folder)
