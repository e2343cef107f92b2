"""Number of attention heads at a fixed d_model (Vaswani et al. 2017, table 3, rows (A)).

1, 2, 4, 8, 16 heads with head dimension d_model / heads (64 -> 64..4 smoke, 384 -> 384..24 full),
so the attention parameter count and FLOPs stay the same: only how attention is split changes.

Published (Vaswani et al., table 3 (A), base model on newstest2013 EN-DE, d_model 512):
  heads  1     4     8 (base)  16    32
  d_k    512   128   64        32    16
  BLEU   24.9  25.5  25.8      25.8  25.4   (dev perplexity 5.29, 5.00, 4.92, 4.91, 5.01)
"single-head attention is 0.9 BLEU worse than the best setting, quality also drops off with too
many heads".
"""
import os

from tfjax.research import sweep

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))
HEADS = (1, 2, 4, 8, 16)
SEEDS = {"smoke": (0, 1), "full": (0, 1, 2)}
REPORT = dict(
    metrics=["eval/loss", "eval/perplexity", "train/tokens_per_sec", "diverged"],
    plots=[{"metric": "eval/loss", "x": "model.num_heads", "lines": (), "logx": True},
           {"curve": "eval/loss", "lines": ("model.num_heads",)}])


def get_config(scale=None):
  """The char LM; get_sweep varies model.num_heads (d_k = d_model / heads) and the seed.

    python experiments/sweep.py --config=configs/ablations/heads.py --scale=smoke \
        --workdir=runs/ablations/heads

  Expected (smoke, 2 seeds, docs/ablations.md): eval/loss within 0.03 nats from 1 to 16 heads
  (2.177 for 1 head, 2.204 for 16).
  """
  return _lm.char_lm(_lm.check_scale(scale, "heads.py"))


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "heads.py")
  return sweep.product({"model.num_heads": HEADS, "seed": SEEDS[scale]})
