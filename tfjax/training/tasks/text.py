"""The text tasks: how a batch feeds a tfjax.nn.models model and what is scored.

  lm              decoder          next-token CE on `weights` (causal LM; synthetic: answer only)
  mlm             encoder          CE on the masked positions (15%, 80/10/10; made by the data)
  seq2seq         encoder_decoder  teacher forcing: decoder_inputs are the targets shifted right
  classification  encoder          CE of the pooled classifier against `labels`

`forward(...)` returns summed statistics, never means, so micro-batches and devices add up exactly:
loss_sum, weight_sum (tokens or rows that count), correct_sum, and `row_correct` (every counted
position of a row right: teacher-forced argmax exact match, which equals greedy-decoding exact match
because each greedy step then sees the correct prefix). `summed_statistics` is that scoring for any
task whose outputs are logits against integer targets (the own-model tasks use it too).
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training.optim import losses
from tfjax.training.tasks.registry import Task, register_task


def summed_statistics(logits_BxLxV, targets_BxL, weights_BxL,
                      label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Summed loss statistics of logits against targets (see module docstring)."""
  loss_sum, weight_sum = losses.cross_entropy(logits_BxLxV, targets_BxL, weights_BxL,
                                              label_smoothing)
  correct_sum, _ = losses.token_accuracy(logits_BxLxV, targets_BxL, weights_BxL)
  predictions_BxL = jnp.argmax(logits_BxLxV, axis=-1)
  wrong_BxL = jnp.logical_and(predictions_BxL != targets_BxL, weights_BxL > 0)
  row_has_target_B = jnp.any(weights_BxL > 0, axis=-1)
  row_correct_B = jnp.logical_and(jnp.logical_not(jnp.any(wrong_BxL, axis=-1)), row_has_target_B)
  return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct_sum,
          "row_correct": row_correct_B, "row_count": row_has_target_B}


def class_statistics(logits_BxC, labels_B, weights_B=None, label_smoothing: float = 0.0):
  """summed_statistics of one prediction per row (a length-1 'sequence')."""
  if weights_B is None:
    weights_B = jnp.ones(labels_B.shape, jnp.float32)
  return summed_statistics(logits_BxC[:, None], labels_B[:, None], weights_B[:, None],
                           label_smoothing)


class TextTask(Task):
  """A task served by a tfjax.nn.models family (config.model: ModelConfig's keys)."""

  def __init__(self, name: str, family: str):
    super().__init__()
    self.name, self.family = name, family

  def model_inputs(self, batch: Mapping[str, Any]) -> tuple[tuple, dict]:
    if self.name == "seq2seq":
      return (batch["encoder_inputs"], batch["decoder_inputs"]), {
          "encoder_segment_ids": batch.get("encoder_segment_ids"),
          "decoder_segment_ids": batch.get("decoder_segment_ids")}
    kwargs = {"segment_ids": batch.get("segment_ids")}
    if self.name == "lm":
      kwargs["positions"] = batch.get("positions")
    else:  # mlm, classification: encoders with BERT's token types
      kwargs["token_type_ids"] = batch.get("token_type_ids")
    return (batch["inputs"],), kwargs

  def row_lengths(self, batch: Mapping[str, Any]) -> tuple[int, int | None]:
    if self.name == "seq2seq":
      return (int(np.shape(batch["decoder_inputs"])[1]),
              int(np.shape(batch["encoder_inputs"])[1]))
    return int(np.shape(batch["inputs"])[1]), None

  def logits_and_targets(self, model: nn.Module, variables, batch: Mapping[str, Any],
                         rngs: dict | None = None):
    args, kwargs = self.model_inputs(batch)
    out = model.apply(variables, *args, **kwargs, rngs=rngs or {})
    if self.name in ("lm", "seq2seq"):
      return out, batch["targets"], batch["weights"]
    if self.name == "mlm":
      return out["mlm_logits"], batch["targets"], batch["weights"]
    labels_B = batch["labels"]
    weights_B = batch.get("weights", jnp.ones(labels_B.shape, jnp.float32))
    return out["class_logits"][:, None], labels_B[:, None], weights_B[:, None]

  def forward(self, model, params, batch, label_smoothing: float = 0.0, rngs=None):
    return summed_statistics(*self.logits_and_targets(model, {"params": params}, batch, rngs),
                             label_smoothing)

  def train_flops_per_row(self, model_cfg, batch) -> float:
    """tfjax/training/accounting/flops.py's count (6N plus attention per token) times the row
    length."""
    # Deferred: flops imports the models.
    from tfjax.training.accounting import flops  # pylint: disable=import-outside-toplevel
    seq_len = self.row_lengths(batch)[0]
    return flops.flops_per_token(model_cfg, seq_len) * seq_len


for _name, _family in (("lm", "decoder"), ("mlm", "encoder"), ("seq2seq", "encoder_decoder"),
                       ("classification", "encoder")):
  register_task(TextTask(_name, _family))
