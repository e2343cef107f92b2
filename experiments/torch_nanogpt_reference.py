"""nanoGPT's train.py loop in PyTorch on CPU or CUDA, timed: the reference run of torch_nanogpt.py.

On CUDA it runs as nanoGPT does: bf16 autocast (TF32 matmuls for what stays float32), fused
AdamW, torch.compile (optional; a compile failure prints one line and the run goes on eager),
batches copied from pinned memory without blocking, and no host sync inside a step, so the host
prepares the next batch while the GPU runs this one. On CPU: float32, eager, unfused, as
nanoGPT's CPU settings. Every eval_every steps nanoGPT's estimate_loss (eval_batches random
batches of each split); at the end the loss on the whole validation split (non-overlapping
windows, as our eval_mode=sequential). With max_seconds the loop stops at the first step
that starts past that budget, evaluates there, and reports how far it got.
"""
import platform
import time

import numpy as np

from torch_nanogpt_model import check_nanogpt_shaped, nanogpt_lr, torch_adamw, torch_gpt, windows

WARMUP_STEPS = 10  # steps timed apart: the first compiles the train graph and warms the allocator


def resolve_device(name: str) -> str:
  """'cpu' or 'cuda' for --device=auto|cpu|cuda; asking for CUDA without one is an error."""
  import torch  # pylint: disable=import-outside-toplevel
  if name not in ("auto", "cpu", "cuda"):
    raise ValueError(f"--device={name!r} is not one of auto, cpu, cuda")
  if name == "cuda" and not torch.cuda.is_available():
    raise ValueError(f"--device=cuda but this torch {torch.__version__} sees no CUDA GPU; "
                     "use --device=cpu or auto")
  if name == "auto":
    return "cuda" if torch.cuda.is_available() else "cpu"
  return name


class CompileFallback:
  """Runs fn(model) through torch.compile, and through the eager model from a compile failure on.

  torch.compile compiles lazily, so a failure surfaces at the first call (forward or backward),
  not at torch.compile(); the failure is printed and recorded in the result, never silent."""

  def __init__(self, model, use_compile: bool):
    import torch  # pylint: disable=import-outside-toplevel
    self.eager, self.model, self.status = model, model, "off"
    if use_compile:
      self.model, self.status = torch.compile(model), "on"

  def __call__(self, fn, on_retry=None):
    try:
      return fn(self.model)
    except Exception as error:  # pylint: disable=broad-except
      if self.status != "on":
        raise
      text = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
      print(f"torch.compile failed ({text[:300]}); running eager", flush=True)
      self.model, self.status = self.eager, f"failed, eager: {text[:300]}"
      if on_retry is not None:
        on_retry()
      return fn(self.model)


def run_reference(config, exp, steps, *, seed=1337, device="auto", use_compile=None,
                  max_seconds=0.0, warmup_steps=WARMUP_STEPS):
  """Trains nanoGPT's recipe for `steps` steps; returns losses, the val curve and timings
  (per-step times and tokens/s over the steps after the first `warmup_steps`, and over all;
  None where no such step ran, as JSON has no NaN)."""
  import contextlib  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  device = resolve_device(device)
  cuda = device == "cuda"
  use_compile = cuda if use_compile is None else use_compile
  torch.manual_seed(seed)
  mc, opt, tc = exp.model_config, config.optimizer, config.train
  check_nanogpt_shaped(mc, allow_dropout=True)
  train_tokens, val_tokens = exp.dataset.train_tokens, exp.dataset.val_tokens
  length, batch = mc.max_len, tc.batch_size
  amp = None
  if cuda:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    amp = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
  autocast = (lambda: torch.autocast("cuda", dtype=amp)) if amp else contextlib.nullcontext
  model = torch_gpt(mc).to(device)
  optimizer = torch_adamw(model, opt, fused=cuda)
  runner = CompileFallback(model, use_compile)

  def sync():
    if cuda:
      torch.cuda.synchronize()

  def random_batch(tokens):
    starts = torch.randint(len(tokens) - length, (batch,)).numpy()
    arrays = [torch.from_numpy(a) for a in windows(tokens, starts, length)]
    if cuda:
      return [a.pin_memory().to(device, non_blocking=True) for a in arrays]
    return arrays

  @torch.no_grad()
  def estimate_loss(tokens):
    def mean_loss(m):  # losses summed on the device: one host sync per split, not per batch
      total = torch.zeros((), device=device)
      for _ in range(tc.eval_batches):
        with autocast():
          total += m(*random_batch(tokens)).float()
      return total.item() / tc.eval_batches
    model.eval()
    loss = runner(mean_loss)
    model.train()
    return loss

  def train_step(it):
    for group in optimizer.param_groups:
      group["lr"] = nanogpt_lr(it, opt, steps)
    inputs, targets = random_batch(train_tokens)

    def forward_backward(m):
      with autocast():
        loss = m(inputs, targets)
      loss.backward()
      return loss
    loss = runner(forward_backward, on_retry=lambda: optimizer.zero_grad(set_to_none=True))
    if opt.clip_norm:
      torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  evals, timer = {}, {"train": 0.0, "eval": 0.0, "first_eval": None, "warmup": None}
  done, loss, stopped = 0, None, False
  start = mark = time.perf_counter()

  def lap(kind):  # seconds since the last mark, booked to `kind`
    nonlocal mark
    sync()
    now = time.perf_counter()
    timer[kind] += now - mark
    mark = now
    return now - start

  for it in range(steps + 1):
    if it == min(warmup_steps, steps) and timer["warmup"] is None:
      lap("train")
      timer["warmup"] = timer["train"]
    over = bool(max_seconds) and it > 0 and time.perf_counter() - start > max_seconds
    if it % tc.eval_every == 0 or it == steps or over:
      lap("train")
      evals[it] = {"train": estimate_loss(train_tokens), "val": estimate_loss(val_tokens)}
      elapsed = lap("eval")
      if timer["first_eval"] is None:
        timer["first_eval"] = timer["eval"]
      print(f"step {it}: train {evals[it]['train']:.4f} val {evals[it]['val']:.4f} "
            f"({elapsed:.1f} s)", flush=True)
    done = it
    if it == steps or over:
      stopped = over and it < steps
      break
    loss = train_step(it)
    if (it + 1) % tc.log_every == 0:
      print(f"iter {it + 1}: loss {loss.item():.4f}", flush=True)  # syncs: once per log_every
  wall = lap("train")
  last = float(loss.item()) if loss is not None else None

  with torch.no_grad(), autocast():
    model.eval()
    sums = np.zeros(2)
    for _, b in exp.dataset.eval_batches(tc.eval_batch_size, mode="sequential"):
      weights = torch.from_numpy(b["weights"]).to(device)
      batch_loss = model(torch.from_numpy(b["inputs"]).long().to(device),
                         torch.from_numpy(b["targets"]).long().to(device), weights)
      sums += [batch_loss.float().item() * weights.sum().item(), weights.sum().item()]

  warm = min(warmup_steps, done)
  steady_s = (timer["train"] - (timer["warmup"] or 0.0)) / max(done - warm, 1)
  all_s = timer["train"] / max(done, 1)
  best = min(evals, key=lambda s: evals[s]["val"])
  return {
      "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
      "device": device,
      "device_name": torch.cuda.get_device_name() if cuda else (platform.processor()
                                                                or platform.machine()),
      "autocast": str(amp).replace("torch.", "") if amp else "off (float32)",
      "fused_adamw": cuda, "compile": runner.status, "seed": seed,
      "steps": steps, "steps_done": done, "stopped_at_max_seconds": stopped,
      "max_seconds": max_seconds,
      "best_val_loss": evals[best]["val"], "best_val_step": best,
      "final_val_loss_eval_batches": evals[done]["val"],
      "final_full_val_loss": sums[0] / sums[1], "last_train_loss": last,
      "wall_s": wall, "train_s": timer["train"], "eval_s": timer["eval"],
      "first_eval_s": timer["first_eval"], "warmup_steps": warm,
      "warmup_s": timer["warmup"] if timer["warmup"] is not None else timer["train"],
      "step_ms": steady_s * 1e3 if done > warm else None,
      "step_ms_with_warmup": all_s * 1e3 if done else None,
      "tokens_per_s": batch * length / steady_s if done > warm else None,
      "tokens_per_s_with_warmup": batch * length / all_s if done else None,
      "evals": evals}
