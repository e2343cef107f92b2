"""Contrastive image-text training of CLIP (tfjax/nn/clip.py): config.task='clip'.

Batch: images [B, H, W, C], token_ids [B, L] (captions), labels [B] (the image's class, for
class_accuracy only). The loss of a batch is the symmetric contrastive loss summed over rows:
row i adds (CE(image i -> its caption) + CE(caption i -> its image)) / 2, the negatives being
the whole batch. So rows are not independent: gradient accumulation (micro-batches with fewer
negatives) is refused, and a mesh computes the batch's [B, B] logits whole (the partitioner
gathers the embeddings), which keeps 1 and N devices equal. After each update the logit scale is
clipped at ln 100 (Radford et al. 2021, sec. 2.5).

Metrics: accuracy = image->text retrieval of the exact pair within the batch; eval/class_accuracy
= a caption of the image's class retrieved (batches repeat classes, so exact-pair accuracy is
capped below 1). Synthetic data: gratings of data.classes classes and captions holding the class's
attribute tokens (tfjax/modalities/synthetic.py).

A prepared image folder (data.name='image_folder', data.path = tfjax-prepare --input=images:DIR's
output): each training image is paired with a caption of its class under one of data.templates
(tfjax/training/tasks/captions.py; the template drawn per row from data.seed and the row's
place in the stream); the held-out split is evaluated with the template of its place, and
zero-shot: eval/zero_shot_accuracy is the share of held-out images whose nearest class embedding
(the mean of the class's template-caption embeddings, renormalized: CLIP's prompt ensemble,
Radford et al. 2021 sec. 3.1.4) is their class's. Padding rows of the last eval batch (weight 0)
are neither pairs nor negatives.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from tfjax.modalities import synthetic
from tfjax.nn.clip import CLIP, CLIPConfig
from tfjax.training.tasks import captions
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.prepared_rows import PreparedRows, open_prepared
from tfjax.training.tasks.registry import register_dataset, register_task
from tfjax.training.tasks.vit import check_image_settings, scaled_pixels


class CLIPTask(OwnModelTask):
  name = family = "clip"
  config_class = CLIPConfig
  rows_independent = False
  # zero_shot_correct_sum only where the eval batches carry class captions (image folders).
  eval_ratios = (("eval/class_accuracy", "class_correct_sum", "weight_sum"),
                 ("eval/zero_shot_accuracy", "zero_shot_correct_sum", "weight_sum"))

  def model_config(self, config):
    values = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
    try:
      return CLIPConfig.from_dict(values)
    except TypeError as e:
      raise ValueError(f"config.model does not fit config.task='clip' ({e}); start the config "
                       "from tfjax.training.config.defaults.base_config('clip'), e.g. "
                       "configs/clip_synthetic.py") from None

  def data_section(self) -> dict:
    return {"classes": 8, "noise": 0.5, "templates": ("a photo of a {name}",)}

  def check(self, config, model_cfg) -> None:
    if config.optimizer.grad_accum_steps != 1:
      raise ValueError(f"optimizer.grad_accum_steps={config.optimizer.grad_accum_steps}: the "
                       "contrastive loss takes its negatives from the whole batch, which "
                       "micro-batches would shrink; set it to 1")
    if config.data.name == "synthetic" and model_cfg.text.eos_id != synthetic.EOS:
      raise ValueError(f"config.model.text.eos_id={model_cfg.text.eos_id}: the synthetic "
                       f"captions end with token {synthetic.EOS}; set eos_id={synthetic.EOS}")
    if config.data.name == "image_folder" and model_cfg.text.eos_id != captions.EOS:
      raise ValueError(f"config.model.text.eos_id={model_cfg.text.eos_id}: template captions end "
                       f"with token {captions.EOS}; set eos_id={captions.EOS}")

  def build_model(self, model_cfg, deterministic: bool = True):
    return CLIP(model_cfg)

  def example_batch(self, model_cfg):
    v, t = model_cfg.vision, model_cfg.text
    return {"images": np.zeros((1, v.image_size, v.image_size, v.channels), np.float32),
            "token_ids": np.full((1, t.max_len), t.eos_id, np.int32)}

  def model_inputs(self, batch):
    return (batch["images"], batch["token_ids"]), {}

  def row_lengths(self, batch):
    return 1, None

  def tokens_per_row(self, model_cfg, batch) -> int:
    return model_cfg.vision.num_patches + 1 + model_cfg.text.max_len

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    out = model.apply({"params": params}, batch["images"], batch["token_ids"], rngs=rngs or {})
    logits_BxB = out["logits_per_image"]
    pairs_B = jnp.arange(logits_BxB.shape[0])
    weights_B = batch.get("weights", jnp.ones(pairs_B.shape, jnp.float32))
    # A padding row (weight 0) is no one's negative: its caption and image leave the softmaxes.
    real_B = weights_B > 0
    logits_BxB = jnp.where(real_B[None, :] & real_B[:, None] | jnp.eye(len(pairs_B), dtype=bool),
                           logits_BxB, -jnp.inf)
    image_loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxB, pairs_B)
    text_loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxB.T, pairs_B)
    picked_B = jnp.argmax(logits_BxB, axis=-1)
    labels_B = batch["labels"]
    right_B = (picked_B == pairs_B) & real_B
    stats = {"loss_sum": jnp.sum(weights_B * (image_loss_B + text_loss_B)) / 2,
             "weight_sum": jnp.sum(weights_B),
             "correct_sum": jnp.sum(weights_B * right_B),
             "class_correct_sum": jnp.sum(weights_B * (labels_B[picked_B] == labels_B)),
             "row_correct": right_B, "row_count": real_B}
    if "class_token_ids" in batch:  # zero-shot: every row carries the same class captions
      stats["zero_shot_correct_sum"] = jnp.sum(weights_B * (zero_shot_predictions(
          model, params, out["image_embeds"], batch["class_token_ids"][0]) == labels_B))
    return stats

  def after_update(self, params):
    return {**params, "logit_scale": jnp.minimum(params["logit_scale"], jnp.log(100.0))}


def synthetic_pairs(config, workdir=None):
  del workdir
  cfg, data = CLIPTask().model_config(config), config.data
  v, t = cfg.vision, cfg.text

  def rows(rng, count):
    images, labels = synthetic.stripes(rng, count, v.image_size, v.channels, data.classes,
                                       data.noise)
    ids = synthetic.captions(rng, labels, t.max_len, t.vocab_size, data.classes)
    return {"images": images, "token_ids": ids, "labels": labels}
  return SyntheticRows(rows, data.seed, data.eval_seed)


def zero_shot_predictions(model, params, image_BxP, class_ids_CxTxL):
  """The class of each image whose prompt-ensemble embedding (the mean of its T template
  captions' unit embeddings, renormalized) is nearest: int [B]."""
  classes, templates, length = class_ids_CxTxL.shape
  text_KxP = model.apply({"params": params}, class_ids_CxTxL.reshape(-1, length),
                         method=CLIP.encode_text).astype(jnp.float32)
  class_CxP = text_KxP.reshape(classes, templates, -1).mean(axis=1)
  class_CxP = class_CxP / jnp.linalg.norm(class_CxP, axis=-1, keepdims=True)
  return jnp.argmax(image_BxP @ class_CxP.T, axis=-1)


def template_choices(seed: int, positions) -> np.ndarray:
  """A uniform draw per training row from (data.seed, the row's place in the stream)."""
  return np.asarray([np.random.default_rng([seed, 17, int(p)]).integers(1 << 30)
                     for p in positions])


def image_folder_captions(config, workdir=None):
  del workdir
  cfg, data = CLIPTask().model_config(config), config.data
  train, held_out = open_prepared(config, "image", "image_folder")
  check_image_settings(train.settings, cfg.vision.image_size, cfg.vision.channels, data.path,
                       "config.model.vision")
  vocab = captions.CaptionVocabulary(data.templates, train.class_names, cfg.text.max_len)
  if cfg.text.vocab_size < vocab.vocab_size:
    raise ValueError(f"config.model.text.vocab_size={cfg.text.vocab_size} < the captions' "
                     f"{vocab.vocab_size} ids (2 + their distinct words): raise it")
  num_templates = len(vocab.templates)

  def train_rows(split, indices, positions):
    labels = split.labels(indices)
    chosen = template_choices(data.seed, positions) % num_templates
    return {"images": scaled_pixels(split.pixels(indices)),
            "token_ids": vocab.caption_ids(labels, chosen), "labels": labels}

  def eval_rows(split, indices, positions):
    labels = split.labels(indices)
    return {"images": scaled_pixels(split.pixels(indices)),
            "token_ids": vocab.caption_ids(labels, positions % num_templates), "labels": labels,
            "class_token_ids": np.broadcast_to(vocab.captions_CxTxL,
                                               (len(indices),) + vocab.captions_CxTxL.shape)}
  dataset = PreparedRows(train, held_out, data.seed, data.eval_seed, train_rows, eval_rows)
  dataset.vocabulary = vocab
  return dataset


register_task(CLIPTask())
register_dataset("clip", "synthetic", synthetic_pairs)
register_dataset("clip", "image_folder", image_folder_captions)
