"""nanoGPT's recipe in PyTorch, beside ours: the reference run, and a step-for-step replay.

Needs PyTorch (not a tfjax dependency; CPU build: `pip install torch`). Two modes:

  # The PyTorch reference of a nanoGPT-shaped config: nanoGPT's training loop (get_lr, AdamW
  # with decay on >= 2-D weights, clip 1.0, estimate_loss on 20 random batches every 250 steps),
  # timed end to end, plus the loss on the whole validation split (the same non-overlapping
  # windows as our `eval_mode=sequential`).
  python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py:cpu \
      --mode=reference --seed=1337 --out=bench_results/torch_ref

  # Lockstep: PyTorch initializes the model, the same weights are copied into our params, and both
  # train on the same batches with nanoGPT's learning-rate curve. Equal losses at every step
  # (to float32 rounding) mean model, loss, clipping, AdamW and weight-decay mask all agree.
  python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py:cpu \
      --mode=lockstep --steps=300 --out=bench_results/torch_lockstep

  # Speed: forward, forward+backward and the whole train step (clip + AdamW included) of both,
  # on one batch of the config's shape; best of 3 x 50 calls after warm-up.
  python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py:cpu \
      --mode=speed --out=bench_results/torch_speed

Writes OUT/torch_nanogpt_MODE.json and .md stamped with device, versions and date. The model
is written here from the published GPT-2/nanoGPT definition (pre-LN blocks, bias-free Linear and
LayerNorm, exact GELU, tied head, N(0, 0.02) init with 0.02/sqrt(2 layers) on the residual
projections), sized by the config's `model` block.
"""

import datetime
import json
import math
import os
import platform
import sys
import time

from absl import flags
import numpy as np

from tfjax.training import cli

_CONFIG = cli.define_config_file("config", None, "A nanoGPT-shaped decoder config.")
_MODE = flags.DEFINE_enum("mode", "reference", ["reference", "lockstep", "speed"], "What to run.")
_SEED = flags.DEFINE_integer("seed", 1337, "torch.manual_seed (nanoGPT uses 1337).")
_STEPS = flags.DEFINE_integer("steps", 0, "Training steps (0: the config's num_steps).")
_OUT = flags.DEFINE_string("out", "bench_results/torch_nanogpt", "Output directory.")


def check_nanogpt_shaped(mc) -> None:
  """The PyTorch model below is GPT-2/nanoGPT only; anything else would compare different math."""
  want = {"family": "decoder", "position": "learned", "norm": "layernorm", "norm_bias": False,
          "norm_placement": "pre", "ffn": "gelu", "ffn_bias": False, "attention_bias": False,
          "tie_embeddings": True, "scaled_residual_init": True, "dropout": 0.0}
  wrong = {k: getattr(mc, k) for k, v in want.items() if getattr(mc, k) != v}
  if mc.num_kv_heads not in (None, mc.num_heads):
    wrong["num_kv_heads"] = mc.num_kv_heads
    want["num_kv_heads"] = mc.num_heads
  if wrong:
    raise ValueError(f"torch_nanogpt.py compares nanoGPT-shaped decoders only; the config has "
                     f"{wrong}, needs {dict((k, want[k]) for k in wrong)}")


def nanogpt_lr(it, opt, total_steps):
  """nanoGPT's get_lr(it): linear warmup (it + 1) / (warmup + 1), cosine to min_lr at the end."""
  if it < opt.warmup_steps:
    return opt.lr * (it + 1) / (opt.warmup_steps + 1)
  ratio = min((it - opt.warmup_steps) / max(total_steps - opt.warmup_steps, 1), 1.0)
  return opt.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (opt.lr - opt.min_lr)


def torch_gpt(mc):
  """nanoGPT's GPT for model config `mc` (dropout off)."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch import nn  # pylint: disable=import-outside-toplevel
  import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
  d, heads = mc.d_model, mc.num_heads

  class Block(nn.Module):
    def __init__(self):
      super().__init__()
      self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
      self.c_attn = nn.Linear(d, 3 * d, bias=False)
      self.attn_proj = nn.Linear(d, d, bias=False)
      self.c_fc = nn.Linear(d, mc.d_ff, bias=False)
      self.mlp_proj = nn.Linear(mc.d_ff, d, bias=False)

    def forward(self, x_BxLxD):
      b, length, _ = x_BxLxD.shape
      qkv = self.c_attn(self.ln_1(x_BxLxD)).split(d, dim=2)
      q, k, v = (t.view(b, length, heads, d // heads).transpose(1, 2) for t in qkv)
      y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
      x_BxLxD = x_BxLxD + self.attn_proj(y.transpose(1, 2).reshape(b, length, d))
      return x_BxLxD + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x_BxLxD))))

  class GPT(nn.Module):
    def __init__(self):
      super().__init__()
      self.wte, self.wpe = nn.Embedding(mc.vocab_size, d), nn.Embedding(mc.max_len, d)
      self.blocks = nn.ModuleList([Block() for _ in range(mc.num_layers)])
      self.ln_f = nn.LayerNorm(d, bias=False)
      self.lm_head = nn.Linear(d, mc.vocab_size, bias=False)
      self.wte.weight = self.lm_head.weight  # tied
      for module in self.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
          nn.init.normal_(module.weight, 0.0, 0.02)
      for name, weight in self.named_parameters():
        if name.endswith("proj.weight"):
          nn.init.normal_(weight, 0.0, 0.02 / math.sqrt(2 * mc.num_layers))

    def forward(self, idx_BxL, targets_BxL, weights_BxL=None):
      x = self.wte(idx_BxL) + self.wpe(torch.arange(idx_BxL.shape[1]))
      for block in self.blocks:
        x = block(x)
      logits = self.lm_head(self.ln_f(x))
      losses = F.cross_entropy(logits.flatten(0, 1), targets_BxL.flatten(), reduction="none")
      if weights_BxL is None:
        return losses.mean()
      w = weights_BxL.flatten()
      return (losses * w).sum() / w.sum().clamp(min=1.0)

  return GPT()


def torch_adamw(model, opt):
  """nanoGPT's configure_optimizers: decay on tensors with >= 2 dims, none on the rest."""
  import torch  # pylint: disable=import-outside-toplevel
  params = list(model.parameters())
  groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": opt.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.b1, opt.b2), eps=opt.eps)


def torch_step(model, optimizer, lr, clip, inputs, targets):
  import torch  # pylint: disable=import-outside-toplevel
  for group in optimizer.param_groups:
    group["lr"] = lr
  loss = model(inputs, targets)
  optimizer.zero_grad(set_to_none=True)
  loss.backward()
  if clip:
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
  optimizer.step()
  return loss.item()


def windows(tokens, starts, length):
  """(inputs, targets) int64 arrays of the windows tokens[s : s + length + 1]."""
  rows = np.stack([tokens[s:s + length + 1] for s in starts]).astype(np.int64)
  return rows[:, :-1], rows[:, 1:]


def params_from_torch(model, params, mc):
  """Our param tree (same structure as `params`) holding the torch model's weights."""
  # Copies: a NumPy view of a torch tensor, put on the CPU device, could alias torch's memory and
  # change under torch's in-place optimizer step.
  w = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
  d, heads = mc.d_model, mc.num_heads
  out = {"embed": {"tokens": {"embedding": w["wte.weight"]},
                   "positions": {"embedding": w["wpe.weight"]}},
         "decoder": {"final_norm": {"scale": w["ln_f.weight"]}}}
  for i in range(mc.num_layers):
    t = lambda name, i=i: w[f"blocks.{i}.{name}"]  # noqa: E731
    qkv_DxHxK = [m.reshape(d, heads, d // heads) for m in np.split(t("c_attn.weight").T, 3, 1)]
    out["decoder"][f"layers_{i}"] = {
        "self_attention_norm": {"scale": t("ln_1.weight")},
        "self_attention": {"query": {"kernel": qkv_DxHxK[0]}, "key": {"kernel": qkv_DxHxK[1]},
                           "value": {"kernel": qkv_DxHxK[2]},
                           "out": {"kernel": t("attn_proj.weight").T.reshape(heads, -1, d)}},
        "ffn_norm": {"scale": t("ln_2.weight")},
        "ffn": {"wi": {"kernel": t("c_fc.weight").T}, "wo": {"kernel": t("mlp_proj.weight").T}}}
  import jax  # pylint: disable=import-outside-toplevel
  if jax.tree.structure(out) != jax.tree.structure(dict(params)):
    raise ValueError("our parameter tree no longer matches the nanoGPT mapping in this script")
  return jax.tree.map(lambda ours, theirs: np.asarray(theirs, ours.dtype), dict(params), out)


def run_reference(config, exp, steps):
  """nanoGPT's train.py loop in PyTorch; returns timing and losses."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(_SEED.value)
  mc, opt, tc = exp.model_config, config.optimizer, config.train
  train_tokens, val_tokens = exp.dataset.train_tokens, exp.dataset.val_tokens
  length, batch = mc.max_len, tc.batch_size
  model, evals = torch_gpt(mc), {}
  optimizer = torch_adamw(model, opt)

  def random_batch(tokens):
    starts = torch.randint(len(tokens) - length, (batch,)).numpy()
    return (torch.from_numpy(a) for a in windows(tokens, starts, length))

  @torch.no_grad()
  def estimate_loss(tokens):
    model.eval()
    loss = float(np.mean([model(*random_batch(tokens)).item() for _ in range(tc.eval_batches)]))
    model.train()
    return loss

  start = time.perf_counter()
  for it in range(steps + 1):
    if it % tc.eval_every == 0 or it == steps:
      evals[it] = {"train": estimate_loss(train_tokens), "val": estimate_loss(val_tokens)}
      print(f"step {it}: train {evals[it]['train']:.4f} val {evals[it]['val']:.4f}", flush=True)
    if it == steps:
      break
    last = torch_step(model, optimizer, nanogpt_lr(it, opt, steps), opt.clip_norm,
                      *random_batch(train_tokens))
  wall = time.perf_counter() - start
  with torch.no_grad():
    model.eval()
    sums = np.zeros(2)
    for _, b in exp.dataset.eval_batches(tc.eval_batch_size, mode="sequential"):
      weights = torch.from_numpy(b["weights"])
      loss = model(torch.from_numpy(b["inputs"]).long(), torch.from_numpy(b["targets"]).long(),
                   weights)
      sums += [loss.item() * weights.sum().item(), weights.sum().item()]
  return {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
          "seed": _SEED.value, "steps": steps, "wall_s": wall, "last_train_loss": last,
          "final_val_loss_eval_batches": evals[steps]["val"],
          "final_full_val_loss": sums[0] / sums[1],
          "evals": evals}


def run_lockstep(config, exp, steps):
  """Our jitted train step and PyTorch's, from the same weights on the same batches."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from tfjax.training import experiment, sharding  # pylint: disable=import-outside-toplevel
  from tfjax.training.optimizer import make_optimizer  # pylint: disable=import-outside-toplevel

  torch.manual_seed(_SEED.value)
  mc, opt, tc = exp.model_config, config.optimizer, config.train
  model = torch_gpt(mc)
  optimizer = torch_adamw(model, opt)
  warmup, floor, peak = opt.warmup_steps, opt.min_lr, opt.lr

  def nanogpt_schedule(count):  # nanogpt_lr, traceable
    it = jnp.asarray(count, jnp.float32)
    ratio = jnp.clip((it - warmup) / max(steps - warmup, 1), 0.0, 1.0)
    return jnp.where(it < warmup, peak * (it + 1) / (warmup + 1),
                     floor + 0.5 * (1.0 + jnp.cos(math.pi * ratio)) * (peak - floor))

  ours_opt, _ = make_optimizer(opt, steps, mc.d_model, schedule=nanogpt_schedule)
  exp = dataclasses.replace(exp, optimizer=ours_opt, schedule=nanogpt_schedule)
  placement = sharding.BatchPlacement.for_config(config)
  layout = experiment.state_layout(exp, placement)
  state, shardings = layout.init(), layout.shardings
  params = jax.device_put(params_from_torch(model, jax.device_get(state.params), mc),
                          shardings.params)
  state = state.replace(params=params, opt_state=jax.device_put(ours_opt.init(params),
                                                                shardings.opt_state))
  train_step = experiment.jit_train_step(exp, placement, shardings)
  rng = np.random.default_rng(_SEED.value)
  tokens, length = exp.dataset.train_tokens, mc.max_len
  ours, theirs = [], []
  with placement.axis_rules():
    for it in range(steps):
      inputs, targets = windows(tokens, rng.integers(0, len(tokens) - length, tc.batch_size),
                                length)
      theirs.append(torch_step(model, optimizer, nanogpt_lr(it, opt, steps), opt.clip_norm,
                               torch.from_numpy(inputs), torch.from_numpy(targets)))
      state, metrics = train_step(state, placement.put({"inputs": inputs.astype(np.int32),
                                               "targets": targets.astype(np.int32),
                                               "weights": np.ones(inputs.shape, np.float32)}))
      ours.append(float(metrics["train/loss"]))
  final = params_from_torch(model, jax.device_get(state.params), mc)
  param_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(final), jax.tree.leaves(jax.device_get(state.params))))
  diff = np.abs(np.array(ours) - np.array(theirs))
  return {"torch": torch.__version__, "seed": _SEED.value, "steps": steps,
          "max_abs_loss_diff": float(diff.max()), "argmax_step": int(diff.argmax()),
          "final_max_abs_param_diff": param_diff,
          "mean_loss_last_50": {"tfjax": float(np.mean(ours[-50:])),
                                "torch": float(np.mean(theirs[-50:]))},
          "losses": {"tfjax": ours, "torch": theirs}}


def best_ms(fn, calls=50, repeats=3):
  """Best mean time of `calls` calls of fn (which must block until its result is ready)."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    times.append((time.perf_counter() - start) / calls * 1e3)
  return min(times)


def run_speed(config, exp, steps):
  """ms of forward / forward+backward / train step for PyTorch and for our jitted functions."""
  del steps
  import jax  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from tfjax.training import experiment, sharding, tasks  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel

  mc, opt, tc = exp.model_config, config.optimizer, config.train
  starts = np.random.default_rng(0).integers(0, len(exp.dataset.train_tokens) - mc.max_len,
                                             tc.batch_size)
  inputs, targets = windows(exp.dataset.train_tokens, starts, mc.max_len)
  torch.manual_seed(_SEED.value)
  model = torch_gpt(mc)
  optimizer = torch_adamw(model, opt)
  x, y = torch.from_numpy(inputs), torch.from_numpy(targets)

  def torch_forward():
    with torch.no_grad():
      model(x, y).item()

  def torch_forward_backward():
    model.zero_grad(set_to_none=True)
    model(x, y).backward()

  result = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "torch_forward_ms": best_ms(torch_forward),
            "torch_forward_backward_ms": best_ms(torch_forward_backward),
            "torch_step_ms": best_ms(lambda: torch_step(model, optimizer, opt.lr, opt.clip_norm,
                                                        x, y))}

  placement = sharding.BatchPlacement.for_config(config)
  layout = experiment.state_layout(exp, placement)
  state = layout.init()
  train_step = experiment.jit_train_step(exp, placement, layout.shardings)
  batch = placement.put(
      {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32),
       "weights": np.ones(inputs.shape, np.float32)})
  eval_model, train_model = build_model(mc), build_model(mc.replace(deterministic=False))

  def mean_loss(model_, params):
    stats = tasks.forward(model_, params, batch, "lm", rngs={"dropout": jax.random.key(0)})
    return stats["loss_sum"] / stats["weight_sum"]

  forward = jax.jit(lambda p: mean_loss(eval_model, p))
  gradients = jax.jit(jax.grad(lambda p: mean_loss(train_model, p)))
  holder = {"state": state}

  def ours_step():
    holder["state"], metrics = train_step(holder["state"], batch)
    jax.block_until_ready(metrics)

  with placement.axis_rules():
    result.update({
        "tfjax_forward_ms": best_ms(lambda: jax.block_until_ready(forward(state.params))),
        "tfjax_forward_backward_ms": best_ms(
            lambda: jax.block_until_ready(gradients(state.params))),
        "tfjax_step_ms": best_ms(ours_step)})
  result["step_ratio_tfjax_over_torch"] = result["tfjax_step_ms"] / result["torch_step_ms"]
  return result


def main(argv):
  del argv
  from tfjax.training import experiment, sharding  # pylint: disable=import-outside-toplevel
  config = _CONFIG.value
  sharding.configure_cpu_devices(config)  # before JAX starts, as experiments/train.py does
  import jax  # pylint: disable=import-outside-toplevel
  exp = experiment.prepare(config)
  check_nanogpt_shaped(exp.model_config)
  steps = _STEPS.value or config.train.num_steps
  result = {"config": flags.FLAGS["config"].config_filename, "mode": _MODE.value,
            "jax": jax.__version__, "cpu_count": os.cpu_count(), "devices": jax.device_count(),
            "host": platform.processor() or platform.machine(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
  run = {"reference": run_reference, "lockstep": run_lockstep, "speed": run_speed}[_MODE.value]
  result.update(run(config, exp, steps))
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, f"torch_nanogpt_{_MODE.value}")
  with open(stem + ".json", "w") as f:
    json.dump(result, f, indent=1)
  rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
          for k, v in result.items() if not isinstance(v, dict)]
  with open(stem + ".md", "w") as f:
    f.write("| metric | value |\n| --- | --- |\n" + "\n".join(rows) + "\n")
  print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
  from tfjax.training.metrics import setup_logging  # pylint: disable=import-outside-toplevel
  setup_logging()
  cli.run_absl(main)
