"""Max |tfjax - transformers| of the Funnel Transformer (docs/attention/funnel.md's parity table).

  python experiments/funnel_parity.py

funnel-transformer/small's released architecture (block_sizes [4, 4, 4], 2 decoder layers,
relative_shift attention, mean pooling with separate [CLS] and truncation, pool_q_only) at
width 32 (4 heads of 8, d_inner 128, 99 tokens), every weight moved by N(0, 0.3^2), saved with
save_pretrained, imported with tfjax.hf.modalities.load; 8 inputs of 32 tokens with token types
(2 [CLS], 0 segment A, 1 segment B) and padding (row i keeps 32 - 3i tokens), float32 on CPU.
tests/hf/test_hf_funnel.py asserts the same comparisons within 1e-5 at smaller depth.
"""

import tempfile

import jax
import numpy as np
import torch
import transformers as T

from tfjax.hf import modalities

SMALL = dict(block_sizes=[4, 4, 4], block_repeats=[1, 1, 1], num_decoder_layers=2,
             attention_type="relative_shift", pooling_type="mean", separate_cls=True,
             truncate_seq=True, pool_q_only=True, hidden_act="gelu_new", layer_norm_eps=1e-9,
             vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=128)


def perturbed(model):
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def main():
  rng = np.random.default_rng(1)
  batch, length = 8, 32
  ids = rng.integers(0, 99, size=(batch, length))
  mask = (np.arange(length)[None] < (length - 3 * np.arange(batch))[:, None]).astype(np.float32)
  types = np.zeros((batch, length), np.int64)
  types[:, 0], types[:, length // 2:] = 2, 1
  for cls_name, overrides in (("FunnelModel", {}), ("FunnelBaseModel", {}),
                              ("FunnelForMaskedLM", {}),
                              ("FunnelForSequenceClassification", {"num_labels": 3}),
                              ("FunnelModel", {"attention_type": "factorized"})):
    torch.manual_seed(0)
    hf = perturbed(getattr(T, cls_name)(T.FunnelConfig(**{**SMALL, **overrides})))
    with tempfile.TemporaryDirectory() as tmp:
      hf.save_pretrained(tmp)
      cfg, params = modalities.load(tmp)
    with torch.no_grad():
      out = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
               token_type_ids=torch.tensor(types))
    head = cfg.mlm_head or cfg.num_classes
    want = (out.logits if head else out.last_hidden_state).numpy()
    outs = jax.jit(modalities.model(cfg).apply)({"params": params}, ids, mask, types)
    rows = [("logits" if head else "last_hidden_state", want,
             outs["mlm_logits" if cfg.mlm_head else "logits" if head else "hidden"])]
    if head:  # the hidden state the head reads
      with torch.no_grad():
        hidden = hf.funnel(torch.tensor(ids), attention_mask=torch.tensor(mask),
                           token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
      rows.append(("last_hidden_state", hidden, outs["hidden"]))
    for name, ref, got in rows:
      print(f"| {cls_name} | {cfg.attention_type} | {name} {list(ref.shape)} | "
            f"{np.abs(np.asarray(got) - ref).max():.2e} (|ref| max {np.abs(ref).max():.2f}) |")


if __name__ == "__main__":
  main()
