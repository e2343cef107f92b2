"""Optimizer and learning-rate schedules built from one `ml_collections` config.

Step convention (all schedules): optax calls a schedule with `count`, the number of optimizer
updates already applied, so the first update sees count 0. Every schedule here is written in
terms of the 1-based update number `step = count + 1`, which makes
  * the first update use a non-zero learning rate (lr / warmup_steps during warmup),
  * the peak learning rate land exactly on update number `warmup_steps`,
  * `min_lr` land exactly on update number `total_steps`, the last one of a run.
Relative to nanoGPT's `get_lr(it)` (0-based `it`, warmup `lr * it / warmup_iters`, which spends the
first update at lr = 0) this is `get_lr(it + 1)`: the same curve shifted one update earlier.

Gradient accumulation (`grad_accum_steps = k`) is not an optimizer wrapper: the train step
(tfjax/training/loop/steps.py) sums the gradients of the summed loss over k micro-batches under
lax.scan and divides once by the total weight, then calls `update` once. That is exact even when
micro-batches carry different numbers of non-padding tokens, and `count` stays in optimizer updates.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
import optax

from tfjax.training.checkpointing.trees import path_names

_log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("rsqrt", "cosine", "linear", "constant")
DECAY_EXCLUSIONS = ("norms", "biases", "embeddings")

# A module counts as a normalization layer when its name contains "norm" (LayerNorm_0, RMSNorm_0,
# pre_attention_norm, final_norm) or is GPT-2 style "ln_f", "ln_1", "ln1".
_NORM_MODULE = re.compile(r"norm|^ln(_|\d|$)", re.IGNORECASE)
_NORM_PARAMS = ("scale", "bias")


def default_optimizer_config() -> ml_collections.ConfigDict:
  """Every optimizer/schedule knob with its default; keys not listed here are rejected."""
  c = ml_collections.ConfigDict()
  c.name = "adamw"  # One of OPTIMIZERS. adamw: decoupled decay; adam: coupled L2 (torch Adam).
  c.lr = 1e-3  # Peak learning rate for cosine/linear/constant (ignored by rsqrt).
  c.lr_scale = 1.0  # rsqrt only: multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
  c.b1 = 0.9  # Adam first-moment decay.
  c.b2 = 0.999  # Adam second-moment decay.
  c.eps = 1e-8  # Adam denominator epsilon, added outside the square root.
  c.weight_decay = 0.0  # Decay coefficient; the step applied is lr_t * weight_decay * param.
  c.decay_exclude = DECAY_EXCLUSIONS  # Subset of DECAY_EXCLUSIONS that never decays.
  c.clip_norm = 1.0  # Global gradient-norm clip before Adam; 0 or None turns it off.
  c.schedule = "cosine"  # One of SCHEDULES; see make_schedule.
  c.warmup_steps = 100  # Linear warmup length in optimizer updates (rsqrt needs >= 1).
  c.min_lr = 1e-4  # Final learning rate of cosine/linear decay, reached at total_steps.
  c.grad_accum_steps = 1  # Micro-batches per optimizer update, accumulated inside the train step.
  # -1: as many as give each batch shard train.micro_batch_per_device rows (resolved at setup).
  return c


def _is_int(value, minimum: int) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def _invalid(key: str, value: Any, valid: Any) -> ValueError:
  return ValueError(f"optimizer config {key}={value!r} is invalid; valid: {valid}")


def _resolve(opt_config) -> ml_collections.ConfigDict:
  """Defaults overlaid with `opt_config`; a key the defaults lack is most likely a typo.

  Built as a fresh ConfigDict (not `defaults.update`) so that a wrongly typed value reaches our
  own checks, which name the key and the valid values, instead of ConfigDict's TypeError.
  """
  defaults = default_optimizer_config().to_dict()
  given = dict(opt_config.items())
  unknown = sorted(set(given) - set(defaults))
  if unknown:
    raise ValueError(f"unknown optimizer config keys {unknown}; valid keys: {sorted(defaults)}")
  return ml_collections.ConfigDict({**defaults, **given})


def make_schedule(opt_config, total_steps: int, d_model: Optional[int] = None) -> optax.Schedule:
  """Learning rate as a function of optax's `count` (0 for the first update); see module doc.

  With step = count + 1, w = warmup_steps, T = total_steps:
    rsqrt:    lr_scale * d_model^-0.5 * min(step^-0.5, step * w^-1.5)  (Vaswani et al. 2017, eq. 3;
              peak lr_scale * (d_model * w)^-0.5 at step == w; `lr` and `min_lr` are unused).
    cosine:   lr * step / w while step < w, then min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2
              with r = clip((step - w) / (T - w), 0, 1), so min_lr from step T on.
    linear:   the same warmup, then lr + (min_lr - lr) * r.
    constant: the same warmup, then lr.
  """
  c = _resolve(opt_config)
  if c.schedule not in SCHEDULES:
    raise _invalid("schedule", c.schedule, SCHEDULES)
  if not _is_int(total_steps, 1):
    raise ValueError(f"total_steps={total_steps!r} must be a positive int")
  if not _is_int(c.warmup_steps, 0):
    raise _invalid("warmup_steps", c.warmup_steps, "an int >= 0")
  warmup = int(c.warmup_steps)

  if c.schedule == "rsqrt":
    if warmup < 1:
      raise _invalid("warmup_steps", warmup, "an int >= 1 for schedule='rsqrt'")
    if d_model is None or d_model < 1:
      raise ValueError(f"schedule='rsqrt' needs a positive d_model, got {d_model!r}")
    scale = c.lr_scale * d_model ** -0.5

    def rsqrt(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      return scale * jnp.minimum(jax.lax.rsqrt(step), step * warmup ** -1.5)

    return rsqrt

  if c.lr <= 0 or c.min_lr < 0:
    raise ValueError(f"optimizer config needs lr > 0 and min_lr >= 0, got lr={c.lr!r}, "
                     f"min_lr={c.min_lr!r}")
  peak, floor = c.lr, c.min_lr
  # max(..., 1): a run no longer than its warmup simply never reaches the decay phase.
  decay_steps = max(total_steps - warmup, 1)

  def after_warmup(step):
    progress = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
    if c.schedule == "cosine":
      return floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
    if c.schedule == "linear":
      return peak + (floor - peak) * progress
    return jnp.full_like(step, peak)  # constant

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    if warmup == 0:
      return after_warmup(step)
    return jnp.where(step < warmup, peak * step / warmup, after_warmup(step))

  return schedule


def _decay_exclude(value) -> tuple[str, ...]:
  # Command-line overrides arrive as "norms,biases"; configs as tuples or lists.
  if isinstance(value, str):
    names = tuple(s.strip() for s in value.split(",") if s.strip())
  else:
    names = tuple(value or ())
  for name in names:
    if name not in DECAY_EXCLUSIONS:
      raise _invalid("decay_exclude", value, f"a subset of {DECAY_EXCLUSIONS}")
  return names


def _decays(names: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
  if not names:
    return True
  leaf, module = names[-1], names[-2] if len(names) > 1 else ""
  if "biases" in exclude and leaf == "bias":
    return False
  if "norms" in exclude and leaf in _NORM_PARAMS and _NORM_MODULE.search(module):
    return False
  # nn.Embed names its table "embedding"; hand-made tables are e.g. "pos_embedding".
  if "embeddings" in exclude and leaf.endswith("embedding"):
    return False
  return True


def weight_decay_mask(params, decay_exclude=DECAY_EXCLUSIONS):
  """Pytree shaped like `params` with True on every leaf that weight decay applies to.

  Decided by each leaf's path of dict keys, so it works on plain dicts, FrozenDicts and trees of
  `nn.LogicallyPartitioned` boxes alike (a boxed tree gets a boxed mask of bools, which is the
  structure optax.masked needs to line up with boxed gradients):
    norms:      `scale`/`bias` of a module whose name matches norm|^ln (LayerNorm_0, final_norm).
    biases:     every leaf named `bias`.
    embeddings: every leaf whose name ends in `embedding` (nn.Embed tables, pos_embedding).
  """
  exclude = _decay_exclude(decay_exclude)
  paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  # Dict keys only: a boxed leaf (nn.LogicallyPartitioned) adds a trailing `.value` attribute key
  # that is not part of the parameter's name.
  flags = [_decays(path_names(path, dict_keys_only=True), exclude)
           for path, _ in paths_and_leaves]
  return jax.tree_util.tree_unflatten(treedef, flags)


def make_optimizer(opt_config, total_steps: int, d_model: Optional[int] = None,
                   params=None, schedule: Optional[optax.Schedule] = None,
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule) from `opt_config` (see default_optimizer_config).

  Chain: clip global norm -> [adam: + weight_decay * p (coupled L2, as torch.optim.Adam)] ->
  Adam moments with bias correction -> [adamw: + weight_decay * p (decoupled)] -> * -lr_t.
  So AdamW's step is lr_t * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), the optax/PyTorch
  convention (decay scaled by the scheduled lr). Both decays honour the `decay_exclude` mask,
  which is recomputed from the structure of whatever tree is being updated, boxed or not.
  `params`, if given, is only used to check the mask up front and log what it excludes.
  `schedule`, if given, replaces the configured one: a function of optax's `count`, e.g. another
  codebase's exact curve when replaying its run step for step (experiments/torch_nanogpt.py).
  """
  c = _resolve(opt_config)
  if c.name not in OPTIMIZERS:
    raise _invalid("name", c.name, OPTIMIZERS)
  if c.weight_decay is None or c.weight_decay < 0:
    raise _invalid("weight_decay", c.weight_decay, "a float >= 0")
  if c.clip_norm is not None and c.clip_norm < 0:
    raise _invalid("clip_norm", c.clip_norm, "a float >= 0, or 0/None for no clipping")
  if not _is_int(c.grad_accum_steps, 1):
    raise _invalid("grad_accum_steps", c.grad_accum_steps, "an int >= 1")
  exclude = _decay_exclude(c.decay_exclude)
  if schedule is None:
    schedule = make_schedule(c, total_steps, d_model)

  def mask_fn(tree):
    return weight_decay_mask(tree, exclude)

  if params is not None:
    flags = jax.tree_util.tree_leaves(mask_fn(params))
    _log.info("weight decay applies to %d of %d parameter arrays (excluded: %s)",
              sum(flags), len(flags), exclude)

  decay = optax.add_decayed_weights(c.weight_decay, mask_fn) if c.weight_decay else None
  steps = [
      optax.clip_by_global_norm(c.clip_norm) if c.clip_norm else None,
      decay if c.name == "adam" else None,
      optax.scale_by_adam(b1=c.b1, b2=c.b2, eps=c.eps),
      decay if c.name == "adamw" else None,
      optax.scale_by_learning_rate(schedule),
  ]
  optimizer = optax.chain(*(s for s in steps if s is not None))
  return optimizer, schedule
