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

import jax.numpy as jnp

from tfjax import losses

TASK_FAMILY = {"lm": "decoder", "mlm": "encoder", "seq2seq": "encoder_decoder",
               "classification": "encoder"}


def check_task(task: str, family: str) -> None:
  if task not in TASK_FAMILY:
    raise ValueError(f"config.task={task!r} is invalid; choose one of {tuple(TASK_FAMILY)}")
  if TASK_FAMILY[task] != family:
    raise ValueError(
        f"config.task={task!r} needs model.family={TASK_FAMILY[task]!r}, got {family!r}")


def logits_and_targets(model, variables, batch, task: str, rngs=None):
  """(logits, targets, weights) for the task; classification has a length-1 'sequence' axis."""
  rngs = rngs or {}
  if task == "lm":
    logits = model.apply(variables, batch["inputs"], segment_ids=batch.get("segment_ids"),
                         positions=batch.get("positions"), rngs=rngs)
    return logits, batch["targets"], batch["weights"]
  if task == "seq2seq":
    logits = model.apply(variables, batch["encoder_inputs"], batch["decoder_inputs"],
                         encoder_segment_ids=batch.get("encoder_segment_ids"),
                         decoder_segment_ids=batch.get("decoder_segment_ids"), rngs=rngs)
    return logits, batch["targets"], batch["weights"]
  out = model.apply(variables, batch["inputs"], segment_ids=batch.get("segment_ids"),
                    token_type_ids=batch.get("token_type_ids"), rngs=rngs)
  if task == "mlm":
    return out["mlm_logits"], batch["targets"], batch["weights"]
  labels = batch["labels"]
  weights = batch.get("weights", jnp.ones(labels.shape, jnp.float32))
  return out["class_logits"][:, None], labels[:, None], weights[:, None]


def forward(model, params, batch, task: str, label_smoothing: float = 0.0, rngs=None):
  """Summed loss statistics of one batch (see module docstring)."""
  logits, targets, weights = logits_and_targets(model, {"params": params}, batch, task, rngs)
  loss_sum, weight_sum = losses.cross_entropy(logits, targets, weights, label_smoothing)
  correct_sum, _ = losses.token_accuracy(logits, targets, weights)
  predictions = jnp.argmax(logits, axis=-1)
  wrong = jnp.logical_and(predictions != targets, weights > 0)
  row_has_target = jnp.any(weights > 0, axis=-1)
  row_correct = jnp.logical_and(jnp.logical_not(jnp.any(wrong, axis=-1)), row_has_target)
  return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct_sum,
          "row_correct": row_correct, "row_count": row_has_target}
