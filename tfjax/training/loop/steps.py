"""The step math: the train state, the train step, K steps in one call, the eval step, evaluation.

Pure functions of (state, batch); tfjax/training/loop/experiment.py jits them with shardings and
tfjax/training/loop/train.py loops over them. Resuming is exact because nothing here depends on the
call history: dropout keys are fold_in(rng, step), and the batch is a pure function of (seed, step)
(tfjax/data/datasets.py).
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfjax.training import tasks
from tfjax.training.parallel import cpu_fusion

# The summed statistics of tasks.forward that a step adds up over micro-batches.
_SUMS = ("loss_sum", "weight_sum", "correct_sum")
# Step metrics about non-finite steps (the loop pops them; tfjax/training/loop/divergence.py): how
# many steps of the call had a NaN/inf loss or grad norm, and the (1-based) step number of the
# first.
NONFINITE, FIRST_NONFINITE = "train/nonfinite_steps", "train/first_nonfinite_step"


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule, task: str, label_smoothing: float,
                    grad_accum_steps: int, sum_over_shards: Callable | None = None) -> Callable:
  """(state, batch) -> (state, metrics). With k micro-batches, gradients of the summed loss are
  added up under lax.scan and divided once by the total weight, so k steps of B/k equal one step
  of B. `sum_over_shards` (cpu_fusion.summed_over_shards) optionally wraps the gradient sums.
  The task's `after_update` acts on the updated params (the identity but for CLIP's clipped
  temperature)."""
  after_update = tasks.get_task(task).after_update

  def summed_loss(params, batch, rng):
    stats = tasks.forward(model, params, batch, task, label_smoothing, rngs={"dropout": rng})
    return stats["loss_sum"], {k: stats[k] for k in _SUMS}

  # cpu_fusion.applied: the XLA:CPU fusion boundary on the residual-stream gradient, per the
  # policy set at setup (experiment.prepare); the identity elsewhere.
  grad_fn = jax.grad(cpu_fusion.applied(summed_loss), has_aux=True)

  def summed_gradients(params, batch, rng):
    """(gradient of the summed loss, summed loss/weight/correct counts) over `batch`."""
    if grad_accum_steps == 1:
      return grad_fn(params, batch, rng)
    micro = jax.tree.map(
        lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]),
        batch)

    def accumulate(carry, inputs):
      index, micro_batch = inputs
      sums = grad_fn(params, micro_batch, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, sums), None

    zeros = jax.tree.map(jnp.zeros_like, (params, jax.eval_shape(
        summed_loss, params, jax.tree.map(lambda x: x[0], micro), rng)[1]))
    sums, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
    return sums

  if sum_over_shards is not None:
    summed_gradients = sum_over_shards(summed_gradients)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, stats = summed_gradients(state.params, batch, rng)
    weight = jnp.maximum(stats["weight_sum"], 1.0)
    grads = jax.tree.map(lambda g: g / weight, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    loss, grad_norm = stats["loss_sum"] / weight, optax.global_norm(grads)
    # A NaN/inf loss or gradient is never applied: params and optimizer state stay as they were
    # (tfjax/training/loop/divergence.py; the loop stops or skips on NONFINITE).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # pylint: disable-next=unnecessary-lambda-assignment
    keep_finite = lambda new, old: jnp.where(finite, new, old)
    new_state = state.replace(
        step=state.step + 1,
        params=jax.tree.map(keep_finite, after_update(optax.apply_updates(state.params, updates)),
                            state.params),
        opt_state=jax.tree.map(keep_finite, opt_state, state.opt_state))
    metrics = {"train/loss": loss, "train/accuracy": stats["correct_sum"] / weight,
               "train/grad_norm": grad_norm, "train/lr": schedule(state.step),
               NONFINITE: jnp.where(finite, 0, 1).astype(jnp.int32),
               FIRST_NONFINITE: jnp.where(finite, -1, state.step + 1).astype(jnp.int32)}
    return new_state, metrics

  return train_step


def make_multi_step(train_step: Callable) -> Callable:
  """(state, batches, num_steps) -> (state after `num_steps` steps, the last step's metrics;
  NONFINITE and FIRST_NONFINITE cover all the call's steps).

  `batches` stacks K batches ([K, B, ...] leaves); a lax.fori_loop runs `train_step` on the first
  `num_steps` <= K of them inside one program. Why: one call and one host-to-device copy per K
  steps instead of per step removes a per-step dispatch, device synchronization and copy, which
  matter for small models on CPU (docs/benchmarks/cpu_training.md). The step math is the same;
  `num_steps` is traced, so one program serves every count."""

  # Why jit: the metrics' shapes come from tracing the step once (eval_shape), and a jitted
  # function keeps that trace, so the loop body reuses it instead of tracing the model again.
  train_step = jax.jit(train_step)

  def multi_step(state, batches, num_steps):
    def one_step(i, carry):
      batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), batches)
      state, metrics = train_step(carry[0], batch)
      count, first = carry[1][NONFINITE], carry[1][FIRST_NONFINITE]
      metrics[NONFINITE] = count + metrics[NONFINITE]
      metrics[FIRST_NONFINITE] = jnp.where(first >= 0, first, metrics[FIRST_NONFINITE])
      return state, metrics

    first_batch = jax.tree.map(lambda x: x[0], batches)
    metric_shapes = jax.eval_shape(train_step, state, first_batch)[1]
    no_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    no_metrics[FIRST_NONFINITE] = jnp.int32(-1)
    return jax.lax.fori_loop(0, num_steps, one_step, (state, no_metrics))

  return multi_step


def make_eval_step(model: nn.Module, task: str) -> Callable:
  """(params, batch) -> summed loss, weight and correct counts, exact rows and counted rows, and
  the further sums the task's eval_ratios read (those its forward returns for this data: CLIP's
  zero-shot sum needs class captions)."""
  own_sums = {num for _, num, _ in tasks.get_task(task).eval_ratios} - set(_SUMS) - {
      "exact_sum", "row_sum"}

  def eval_step(params, batch):
    stats = tasks.forward(model, params, batch, task)
    return {**{k: stats[k] for k in _SUMS},
            "exact_sum": jnp.sum(stats["row_correct"]), "row_sum": jnp.sum(stats["row_count"]),
            **{k: stats[k] for k in sorted(own_sums) if k in stats}}
  return eval_step


def evaluate(eval_step: Callable, params, eval_batches, trained_lengths=None,
             ratios: tuple = ()) -> dict:
  """Loss, perplexity and accuracy; per synthetic test length L also eval/loss@L and
  eval/exact_match@L.

  `eval_batches`: [(group name, batch already on the devices)]; the eval set is fixed, so it is
  placed once per run rather than copied from the host at every evaluation. Synthetic test
  groups are named len_L. With `trained_lengths` = (lo, hi), the headline eval/loss, perplexity
  and accuracy average only the groups with lo <= L <= hi, the lengths the model was trained on
  (a length never trained would swamp them), and eval/loss_all_lengths averages every group.
  `ratios`: a task's eval_ratios, ((metric, numerator sum, denominator sum), ...) over the same
  groups as the headline."""
  totals, out = {}, {}
  for name, batch in eval_batches:
    stats = jax.device_get(eval_step(params, batch))
    group = totals.setdefault(name, {k: 0.0 for k in stats})
    for key, value in stats.items():
      group[key] += float(value)

  def trained(name):
    if trained_lengths is None or not name.startswith("len_"):
      return True
    return trained_lengths[0] <= int(name[4:]) <= trained_lengths[1]

  headline = {n: g for n, g in totals.items() if trained(n)} or totals
  overall = {k: sum(g[k] for g in headline.values()) for k in _SUMS}
  loss = overall["loss_sum"] / max(overall["weight_sum"], 1.0)
  out["eval/loss"] = loss
  out["eval/perplexity"] = float(np.exp(min(loss, 50.0)))
  out["eval/accuracy"] = overall["correct_sum"] / max(overall["weight_sum"], 1.0)
  for name, numerator, denominator in ratios:
    if any(numerator not in g for g in headline.values()):
      continue  # a sum this data does not give (CLIP's zero-shot without class captions)
    out[name] = (sum(g[numerator] for g in headline.values())
                 / max(sum(g[denominator] for g in headline.values()), 1.0))
  if len(headline) < len(totals):
    every = {k: sum(g[k] for g in totals.values()) for k in _SUMS}
    out["eval/loss_all_lengths"] = every["loss_sum"] / max(every["weight_sum"], 1.0)
  for name, group in totals.items():
    if name.startswith("len_"):
      out[f"eval/loss@{name[4:]}"] = group["loss_sum"] / max(group["weight_sum"], 1.0)
      out[f"eval/exact_match@{name[4:]}"] = group["exact_sum"] / max(group["row_sum"], 1.0)
  return out
