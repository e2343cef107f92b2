"""nanoGPT's GPT, optimizer and learning-rate curve in PyTorch, sized by a tfjax model config.

Written from the published GPT-2/nanoGPT definition (pre-LN blocks, bias-free Linear and
LayerNorm, exact GELU, tied head, N(0, 0.02) init with 0.02/sqrt(2 layers) on the residual
projections). Dropout sits where nanoGPT puts it: on the embedding sum, on the attention
probabilities (F.scaled_dot_product_attention's dropout_p) and on both residual branches. Shared
by the modes of experiments/torch_nanogpt.py (imported as a sibling module of that script).
"""
import math

import numpy as np


def check_nanogpt_shaped(mc, allow_dropout: bool = False) -> None:
  """The PyTorch model below is GPT-2/nanoGPT only; anything else would compare different math.

  Dropout is allowed only where nothing is compared step for step (the reference run): random
  masks drawn by two frameworks cannot agree."""
  want = {"family": "decoder", "position": "learned", "norm": "layernorm", "norm_bias": False,
          "norm_placement": "pre", "ffn": "gelu", "ffn_bias": False, "attention_bias": False,
          "tie_embeddings": True, "scaled_residual_init": True}
  if not allow_dropout:
    want.update(dropout=0.0, attention_dropout=0.0)
  flat = mc.to_flat()  # the config.model keys the message names
  wrong = {k: flat[k] for k, v in want.items() if flat[k] != v}
  if mc.attention.num_kv_heads not in (None, mc.attention.num_heads):
    wrong["num_kv_heads"] = mc.attention.num_kv_heads
    want["num_kv_heads"] = mc.attention.num_heads
  if wrong:
    raise ValueError(f"torch_nanogpt.py compares nanoGPT-shaped decoders only (dropout only in "
                     f"--mode=reference); the config has {wrong}, needs "
                     f"{dict((k, want[k]) for k in wrong)}")


def nanogpt_lr(it, opt, total_steps):
  """nanoGPT's get_lr(it): linear warmup (it + 1) / (warmup + 1), cosine to min_lr at the end."""
  if it < opt.warmup_steps:
    return opt.lr * (it + 1) / (opt.warmup_steps + 1)
  ratio = min((it - opt.warmup_steps) / max(total_steps - opt.warmup_steps, 1), 1.0)
  return opt.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (opt.lr - opt.min_lr)


def torch_gpt(mc):
  """nanoGPT's GPT for model config `mc`: mc.dropout on embeddings and residual branches,
  mc.attention.dropout on the attention probabilities (both active in train() mode only)."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch import nn  # pylint: disable=import-outside-toplevel
  import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
  d, heads = mc.d_model, mc.attention.num_heads

  def dropout():  # Identity at rate 0: no random draws, so dropout-free runs replay exactly
    return nn.Dropout(mc.dropout) if mc.dropout else nn.Identity()

  class Block(nn.Module):
    def __init__(self):
      super().__init__()
      self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
      self.c_attn = nn.Linear(d, 3 * d, bias=False)
      self.attn_proj = nn.Linear(d, d, bias=False)
      self.c_fc = nn.Linear(d, mc.feed_forward.d_ff, bias=False)
      self.mlp_proj = nn.Linear(mc.feed_forward.d_ff, d, bias=False)
      self.attn_dropout, self.mlp_dropout = dropout(), dropout()

    def forward(self, x_BxLxD):
      b, length, _ = x_BxLxD.shape
      qkv = self.c_attn(self.ln_1(x_BxLxD)).split(d, dim=2)
      q, k, v = (t.view(b, length, heads, d // heads).transpose(1, 2) for t in qkv)
      rate = mc.attention.dropout if self.training else 0.0
      y = F.scaled_dot_product_attention(q, k, v, dropout_p=rate, is_causal=True)
      y = self.attn_proj(y.transpose(1, 2).reshape(b, length, d))
      x_BxLxD = x_BxLxD + self.attn_dropout(y)
      return x_BxLxD + self.mlp_dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x_BxLxD)))))

  class GPT(nn.Module):
    def __init__(self):
      super().__init__()
      self.wte, self.wpe = nn.Embedding(mc.vocab_size, d), nn.Embedding(mc.max_len, d)
      self.embed_dropout = dropout()
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
      positions_L = torch.arange(idx_BxL.shape[1], device=idx_BxL.device)
      x = self.embed_dropout(self.wte(idx_BxL) + self.wpe(positions_L))
      for block in self.blocks:
        x = block(x)
      logits = self.lm_head(self.ln_f(x))
      losses = F.cross_entropy(logits.flatten(0, 1), targets_BxL.flatten(), reduction="none")
      if weights_BxL is None:
        return losses.mean()
      w = weights_BxL.flatten()
      return (losses * w).sum() / w.sum().clamp(min=1.0)

  return GPT()


def torch_adamw(model, opt, fused: bool = False):
  """nanoGPT's configure_optimizers: decay on tensors with >= 2 dims, none on the rest; the
  fused CUDA kernel (one launch for all tensors) where nanoGPT uses it, on CUDA."""
  import torch  # pylint: disable=import-outside-toplevel
  params = list(model.parameters())
  groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": opt.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
  extra = {"fused": True} if fused else {}
  return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.b1, opt.b2), eps=opt.eps, **extra)


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
