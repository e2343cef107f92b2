"""Tasks: how a batch feeds the model and what is scored.

  lm              decoder          next-token CE on `weights` (causal LM; synthetic: answer only)
  mlm             encoder          CE on the masked positions (15%, 80/10/10; made by the data)
  seq2seq         encoder_decoder  teacher forcing: decoder_inputs are the targets shifted right
  classification  encoder          CE of the pooled classifier against `labels`

`forward(...)` returns summed statistics, never means, so micro-batches and devices add up exactly:
loss_sum, weight_sum (tokens or rows that count), correct_sum, and `row_correct` (every counted
position of a row right: teacher-forced argmax exact match, which equals greedy-decoding exact match
because each greedy step then sees the correct prefix).
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training import losses
from tfjax.nn.choices import one_of

# Task name -> the model family that serves it. The one list of task names.
TASK_FAMILY = {"lm": "decoder", "mlm": "encoder", "seq2seq": "encoder_decoder",
               "classification": "encoder"}
TASKS = tuple(TASK_FAMILY)


def check_task(task: str, family: str | None = None) -> str:
  """`task` if it is a known task (and, given `family`, that family serves it); else ValueError
  naming the key, the value and the choices."""
  one_of("config.task", task, TASKS)
  if family is not None and TASK_FAMILY[task] != family:
    raise ValueError(
        f"config.task={task!r} needs model.family={TASK_FAMILY[task]!r}, got {family!r}")
  return task


def model_inputs(batch: Mapping[str, Any], task: str) -> tuple[tuple, dict]:
  """(args, kwargs) that feed `batch` to the task's model: `model.apply(v, *args, **kwargs)` and
  `model.init(rng, *args, **kwargs)` alike. Keys a batch lacks are passed as None."""
  if task == "seq2seq":
    return (batch["encoder_inputs"], batch["decoder_inputs"]), {
        "encoder_segment_ids": batch.get("encoder_segment_ids"),
        "decoder_segment_ids": batch.get("decoder_segment_ids")}
  kwargs = {"segment_ids": batch.get("segment_ids")}
  if task == "lm":
    kwargs["positions"] = batch.get("positions")
  else:  # mlm, classification: encoders with BERT's token types
    kwargs["token_type_ids"] = batch.get("token_type_ids")
  return (batch["inputs"],), kwargs


def row_lengths(batch: Mapping[str, Any], task: str) -> tuple[int, int | None]:
  """(length of the rows the model predicts over: the decoder's for seq2seq, else the inputs',
  the encoder's length for seq2seq else None) of a batch."""
  if task == "seq2seq":
    return int(np.shape(batch["decoder_inputs"])[1]), int(np.shape(batch["encoder_inputs"])[1])
  return int(np.shape(batch["inputs"])[1]), None


def logits_and_targets(model: nn.Module, variables, batch: Mapping[str, Any], task: str,
                       rngs: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(logits_BxLxV, targets_BxL, weights_BxL) for the task; classification has a length-1
  'sequence' axis (L = 1, V = classes)."""
  args, kwargs = model_inputs(batch, task)
  out = model.apply(variables, *args, **kwargs, rngs=rngs or {})
  if task in ("lm", "seq2seq"):
    return out, batch["targets"], batch["weights"]
  if task == "mlm":
    return out["mlm_logits"], batch["targets"], batch["weights"]
  labels_B = batch["labels"]
  weights_B = batch.get("weights", jnp.ones(labels_B.shape, jnp.float32))
  return out["class_logits"][:, None], labels_B[:, None], weights_B[:, None]


def forward(model: nn.Module, params, batch: Mapping[str, Any], task: str,
            label_smoothing: float = 0.0, rngs: dict | None = None) -> dict[str, jax.Array]:
  """Summed loss statistics of one batch (see module docstring)."""
  logits_BxLxV, targets_BxL, weights_BxL = logits_and_targets(
      model, {"params": params}, batch, task, rngs)
  loss_sum, weight_sum = losses.cross_entropy(logits_BxLxV, targets_BxL, weights_BxL,
                                              label_smoothing)
  correct_sum, _ = losses.token_accuracy(logits_BxLxV, targets_BxL, weights_BxL)
  predictions_BxL = jnp.argmax(logits_BxLxV, axis=-1)
  wrong_BxL = jnp.logical_and(predictions_BxL != targets_BxL, weights_BxL > 0)
  row_has_target_B = jnp.any(weights_BxL > 0, axis=-1)
  row_correct_B = jnp.logical_and(jnp.logical_not(jnp.any(wrong_BxL, axis=-1)), row_has_target_B)
  return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct_sum,
          "row_correct": row_correct_B, "row_count": row_has_target_B}
