"""A small Optax training loop for the modality tasks (tfjax/modalities/tasks.py).

AdamW with linear warmup then cosine decay to 10% (config.train: num_steps, learning_rate,
warmup_steps, weight_decay, batch_size, seed, log_every, eval_batches). Each step draws a fresh
synthetic batch from a seeded NumPy generator (the same seed gives the same run); evaluation
uses batches from a separate seed the training stream never draws. The workdir receives
`metrics.jsonl` (one JSON object per log line), `config.json` and `params.msgpack` (flax
serialization of the final params; `load_run` reads them back, e.g. for
tfjax.hf.modalities.export).

Why not tfjax/training/train.py: that loop is built around token batches of the text families
(packing, token-weighted losses, the LM/MLM/seq2seq tasks); these front-ends need image and
spectrogram batches and a contrastive loss, which a forty-line loop states plainly.
"""

from __future__ import annotations

import json
import os
import time

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from flax import serialization

from tfjax.modalities import tasks


def optimizer(train) -> optax.GradientTransformation:
  if max(train.num_steps, 2) <= max(1, train.warmup_steps):  # optax: "positive decay_steps"
    raise ValueError(f"train.warmup_steps={train.warmup_steps} leaves no steps to decay over in "
                     f"train.num_steps={train.num_steps}; give more steps than warmup steps")
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, train.learning_rate, max(1, train.warmup_steps), max(train.num_steps, 2),
      end_value=0.1 * train.learning_rate)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, weight_decay=train.weight_decay))


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config`'s task; returns {'first_loss', 'final_loss' (mean of the last 10 steps),
  'eval_<metric>' ..., 'seconds'} and writes the workdir (module docstring)."""
  task = tasks.build(config)
  run = config.train
  if os.path.exists(os.path.join(workdir, "params.msgpack")):
    raise ValueError(f"{workdir} already holds a trained model; train into a new directory")
  params = nn.meta.unbox(task.init(jax.random.PRNGKey(run.seed))["params"])
  tx = optimizer(run)  # checks the schedule before the workdir is written
  opt_state = tx.init(params)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json(indent=2))

  @jax.jit
  def step(params, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(task.loss, has_aux=True)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return task.after_update(optax.apply_updates(params, updates)), opt_state, metrics

  evaluate = jax.jit(task.evaluate)
  rng = np.random.default_rng(run.seed)
  losses, start = [], time.time()
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as log:
    for i in range(1, run.num_steps + 1):
      params, opt_state, metrics = step(params, opt_state, task.batch(rng, run.batch_size))
      metrics = tasks.to_host(metrics)
      losses.append(metrics["loss"])
      if i == 1 or i % run.log_every == 0 or i == run.num_steps:
        log.write(json.dumps({"step": i, **{f"train/{k}": v for k, v in metrics.items()}}) + "\n")
        print(f"step {i}: " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)
    eval_rng = np.random.default_rng(run.seed + 10_000)
    results = [tasks.to_host(evaluate(params, task.batch(eval_rng, run.batch_size)))
               for _ in range(run.eval_batches)]
    final = {f"eval_{k}": float(np.mean([r[k] for r in results])) for k in results[0]}
    log.write(json.dumps({"step": run.num_steps, **{k.replace("eval_", "eval/"): v
                                                    for k, v in final.items()}}) + "\n")
  with open(os.path.join(workdir, "params.msgpack"), "wb") as f:
    f.write(serialization.msgpack_serialize(jax.device_get(params)))
  summary = {"first_loss": losses[0], "final_loss": float(np.mean(losses[-10:])), **final,
             "seconds": time.time() - start}
  print("done: " + " ".join(f"{k}={v:.4g}" for k, v in summary.items()), flush=True)
  return summary


def load_run(workdir: str):
  """(task, params) of a finished run: task.cfg is the model config (for tfjax.hf.modalities)."""
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  task = tasks.build(config)
  with open(os.path.join(workdir, "params.msgpack"), "rb") as f:
    params = serialization.msgpack_restore(f.read())
  return task, params
