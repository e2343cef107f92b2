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
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from tfjax.modalities import synthetic
from tfjax.nn.clip import CLIP, CLIPConfig
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.registry import register_dataset, register_task


class CLIPTask(OwnModelTask):
  name = family = "clip"
  config_class = CLIPConfig
  rows_independent = False
  eval_ratios = (("eval/class_accuracy", "class_correct_sum", "weight_sum"),)

  def model_config(self, config):
    values = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
    try:
      return CLIPConfig.from_dict(values)
    except TypeError as e:
      raise ValueError(f"config.model does not fit config.task='clip' ({e}); start the config "
                       "from tfjax.training.config.defaults.base_config('clip'), e.g. "
                       "configs/clip_synthetic.py") from None

  def data_section(self) -> dict:
    return {"classes": 8, "noise": 0.5}

  def check(self, config, model_cfg) -> None:
    if config.optimizer.grad_accum_steps != 1:
      raise ValueError(f"optimizer.grad_accum_steps={config.optimizer.grad_accum_steps}: the "
                       "contrastive loss takes its negatives from the whole batch, which "
                       "micro-batches would shrink; set it to 1")
    if config.data.name == "synthetic" and model_cfg.text.eos_id != synthetic.EOS:
      raise ValueError(f"config.model.text.eos_id={model_cfg.text.eos_id}: the synthetic "
                       f"captions end with token {synthetic.EOS}; set eos_id={synthetic.EOS}")

  def build_model(self, model_cfg, deterministic: bool = True):
    return CLIP(model_cfg)

  def model_inputs(self, batch):
    return (batch["images"], batch["token_ids"]), {}

  def row_lengths(self, batch):
    return 1, None

  def tokens_per_row(self, model_cfg, batch) -> int:
    return model_cfg.vision.num_patches + 1 + model_cfg.text.max_len

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    logits_BxB = model.apply({"params": params}, batch["images"], batch["token_ids"],
                             rngs=rngs or {})["logits_per_image"]
    pairs_B = jnp.arange(logits_BxB.shape[0])
    image_loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxB, pairs_B)
    text_loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxB.T, pairs_B)
    picked_B = jnp.argmax(logits_BxB, axis=-1)
    labels_B = batch["labels"]
    right_B = picked_B == pairs_B
    rows_B = jnp.ones(pairs_B.shape, jnp.bool_)
    return {"loss_sum": jnp.sum(image_loss_B + text_loss_B) / 2,
            "weight_sum": jnp.float32(logits_BxB.shape[0]),
            "correct_sum": jnp.sum(right_B.astype(jnp.float32)),
            "class_correct_sum": jnp.sum((labels_B[picked_B] == labels_B).astype(jnp.float32)),
            "row_correct": right_B, "row_count": rows_B}

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


register_task(CLIPTask())
register_dataset("clip", "synthetic", synthetic_pairs)
