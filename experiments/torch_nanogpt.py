"""nanoGPT's recipe in PyTorch, beside ours: the reference run, and a step-for-step replay.

Needs PyTorch (not a tfjax dependency; CPU build: `pip install torch`). Three modes:

  # The PyTorch reference of a nanoGPT-shaped config: nanoGPT's train.py loop (get_lr, AdamW
  # with decay on >= 2-D weights, clip, dropout, estimate_loss on eval_batches random batches
  # every eval_every steps), timed, plus the loss on the whole validation split (the same
  # non-overlapping windows as our `eval_mode=sequential`). On CUDA as nanoGPT runs it: bf16
  # autocast, fused AdamW, torch.compile (--nocompile: eager). Best val loss and its step, the
  # val curve, wall-clock and per-step times with and without compile/warm-up, tokens/s.
  python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py:cpu \
      --mode=reference --seed=1337 --out=bench_results/torch_ref
  python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py \
      --mode=reference --device=cuda --max_seconds=110 --out=bench_results/nanogpt

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
(experiments/torch_nanogpt_model.py) is written from the published GPT-2/nanoGPT definition,
sized by the config's `model` block; lockstep and speed need a dropout-free config (the
`:cpu` one), since two frameworks cannot draw the same dropout masks.
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

from tfjax.training.entry import cli
from torch_nanogpt_model import check_nanogpt_shaped, nanogpt_lr, torch_adamw, torch_gpt
from torch_nanogpt_model import torch_step, windows
from torch_nanogpt_reference import run_reference

_CONFIG = cli.define_config_file("config", None, "A nanoGPT-shaped decoder config.")
_MODE = flags.DEFINE_enum("mode", "reference", ["reference", "lockstep", "speed"], "What to run.")
_SEED = flags.DEFINE_integer("seed", 1337, "torch.manual_seed (nanoGPT uses 1337).")
_STEPS = flags.DEFINE_integer("steps", 0, "Training steps (0: the config's num_steps).")
_OUT = flags.DEFINE_string("out", "bench_results/torch_nanogpt", "Output directory.")
_DEVICE = flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"],
                            "--mode=reference: where PyTorch trains (auto: CUDA if present).")
_COMPILE = flags.DEFINE_boolean("compile", None, "--mode=reference: torch.compile the model "
                                "(default: on CUDA only, as nanoGPT; a failure falls back to "
                                "eager with a message).")
_MAX_SECONDS = flags.DEFINE_float("max_seconds", 0.0, "--mode=reference: stop the training loop "
                                  "(evaluations and compile included) at the first step past "
                                  "this many seconds, evaluate there and report the steps done; "
                                  "0: no limit.")


def params_from_torch(model, params, mc):
  """Our param tree (same structure as `params`) holding the torch model's weights."""
  # Copies: a NumPy view of a torch tensor, put on the CPU device, could alias torch's memory and
  # change under torch's in-place optimizer step.
  w = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
  d, heads = mc.d_model, mc.attention.num_heads
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


def reference(config, exp, steps):
  """nanoGPT's recipe trained in PyTorch (experiments/torch_nanogpt_reference.py)."""
  return run_reference(config, exp, steps, seed=_SEED.value, device=_DEVICE.value,
                       use_compile=_COMPILE.value, max_seconds=_MAX_SECONDS.value)


def run_lockstep(config, exp, steps):
  """Our jitted train step and PyTorch's, from the same weights on the same batches."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from tfjax.training.optim.optimizer import make_optimizer

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
  from tfjax.training import tasks  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
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
  if _MODE.value == "reference":  # PyTorch owns the GPU here; JAX only builds the data and must
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # not reserve its memory
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  config = _CONFIG.value
  sharding.configure_cpu_devices(config)  # before JAX starts, as experiments/train.py does
  import jax  # pylint: disable=import-outside-toplevel
  exp = experiment.prepare(config)
  config = exp.config  # the values the run uses (e.g. train.eval_batch_size -1 resolved)
  check_nanogpt_shaped(exp.model_config, allow_dropout=_MODE.value == "reference")
  steps = _STEPS.value or config.train.num_steps
  result = {"config": flags.FLAGS["config"].config_filename, "mode": _MODE.value,
            "jax": jax.__version__, "cpu_count": os.cpu_count(), "devices": jax.device_count(),
            "host": platform.processor() or platform.machine(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
  run = {"reference": reference, "lockstep": run_lockstep, "speed": run_speed}[_MODE.value]
  result.update(run(config, exp, steps))
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, f"torch_nanogpt_{_MODE.value}")
  with open(stem + ".json", "w") as f:
    json.dump(result, f, indent=1)
  rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
          for k, v in result.items() if not isinstance(v, dict)]
  table = "| metric | value |\n| --- | --- |\n" + "\n".join(rows) + "\n"
  if "evals" in result:  # the loss curve of nanoGPT's estimate_loss
    table += "\n| step | train loss | val loss |\n| --- | --- | --- |\n" + "".join(
        f"| {step} | {e['train']:.4f} | {e['val']:.4f} |\n" for step, e in result["evals"].items())
  with open(stem + ".md", "w") as f:
    f.write(table)
  print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=import-outside-toplevel
  setup_logging()
  cli.run_absl(main)
