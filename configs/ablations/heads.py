"""Number of attention heads (Vaswani et al. 2017, table 3, rows (A) and (B)).

Two sets of arms (model.num_heads, and model.head_dim for the second; nothing else differs):
  fixed d_model  1, 2, 4, 8, 16, 32 heads with head dimension d_model / heads (head_dim unset:
                 64 -> 64..2 smoke and medium, 384 -> 384..12 full), so the attention parameter
                 count and FLOPs stay the same: only how attention is split changes (row (A))
  fixed d_k      head_dim = d_model / 4 (16 smoke and medium, 96 full) with 1, 2, 8, 16 heads:
                 the attention width (and its parameters) grows with the heads (4 heads is the
                 fixed-d_model row). A capacity comparison, not a row of the paper: row (B)
                 holds the heads at 8 and shrinks d_k instead (this sweep has no such arm).
evaluate_point records params/attention and params/total per point.

Published (Vaswani et al., table 3, base model on newstest2013 EN-DE, d_model 512):
  (A) heads  1     4     8 (base)  16    32
      d_k    512   128   64        32    16
      BLEU   24.9  25.5  25.8      25.8  25.4   (dev perplexity 5.29, 5.00, 4.92, 4.91, 5.01)
  (B) 8 heads, d_k 16: BLEU 25.1 (ppl 5.16); d_k 32: 25.4 (5.01): smaller keys hurt.
"""
import math
import os

from tfjax.research import sweep

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))
HEADS = (1, 2, 4, 8, 16, 32)
FIXED_DK_HEADS = (1, 2, 8, 16)
SEEDS = {"smoke": (0, 1), "medium": (0, 1, 2), "full": (0, 1, 2)}
# The claims' arms (1, 8 and 32 heads at fixed d_model) get more seeds at medium: at 3 vs 3 the
# design had power 0.37 for the paper's 32-vs-8 gap (docs/ablations.md, the rule's power).
CLAIM_HEADS = (1, 8, 32)
CLAIM_SEEDS = {"smoke": SEEDS["smoke"], "medium": tuple(range(7)), "full": SEEDS["full"]}
# Both claims were read at 3 vs 3 seeds twice before the claim arms got 7 seeds each (rerun
# together on one CPU): on CPU (runs at e24efa9, doc 6c991d9) and on an H200 (fbc79d3). p is
# multiplied by the looks (the rule).
LOOKS = {"smoke": (), "medium": ((3, 3), (3, 3)), "full": ()}
ARM_KEYS = ("model.num_heads", "model.head_dim")
PUBLISHED_PPL = {1: 5.29, 4: 5.00, 8: 4.92, 16: 4.91, 32: 5.01}  # table 3 (A), fixed d_model
REPORT = dict(
    # No tokens/s: the points of a sweep share a machine (two at a time on 2 CPU cores, twelve on
    # one GPU), so a point's throughput measures its neighbours as much as its arm.
    metrics=["eval/loss", "eval/perplexity", "params/attention", "params/total", "diverged"],
    plots=[{"metric": "eval/loss", "x": "model.num_heads", "lines": ("model.head_dim",),
            "logx": True, "xlabel": "attention heads", "ylabel": "final eval loss (nats)",
            "published": {"head_dim=none": PUBLISHED_PPL},
            "published_label": "Vaswani et al. 2017, table 3 (A), d_model 512",
            "published_xlabel": "dev perplexity (newstest2013 EN-DE)",
            "file": "heads_eval_loss.png",
            "title": "eval loss vs heads (head_dim=none: d_model / heads)"},
           {"curve": "eval/loss", "lines": ("model.num_heads", "model.head_dim"),
            "ylabel": "eval loss (nats)", "file": "heads_curves.png",
            "title": "eval loss during training"}])


def CLAIMS(scale=None):  # pylint: disable=invalid-name  (a sweep's claims, per scale)
  """Vaswani et al.'s table 3 row (A) as claims on the final eval loss. The fixed-d_k arms are a
  capacity comparison, not a row of the paper: their rows are in the tables, without a verdict
  (a verdict word would read as a reproduction of a claim nobody made)."""
  scale = _lm.check_scale(scale, "heads.py")
  heads = lambda h: {"model.num_heads": h, "metric": "eval/loss"}  # noqa: E731
  # The paper's gap as a log-perplexity difference (nats per subword token there, per character
  # here: a yardstick of size, not the same quantity) for the design's power (the rule).
  effect = lambda h: round(math.log(PUBLISHED_PPL[h] / PUBLISHED_PPL[8]), 4)  # noqa: E731
  return [
      dict(id="one_head_worse", claim="1 head is worse than 8 at fixed d_model (row (A))",
           paper=f"dev ppl {PUBLISHED_PPL[1]} vs {PUBLISHED_PPL[8]} (table 3, row (A) vs base)",
           a=heads(1), b=heads(8), expect="greater", paper_effect=effect(1),
           earlier_looks=LOOKS[scale]),
      dict(id="many_heads_worse", claim="32 heads are worse than 8 at fixed d_model (row (A))",
           paper=f"dev ppl {PUBLISHED_PPL[32]} vs {PUBLISHED_PPL[8]} (table 3, row (A) vs base)",
           a=heads(32), b=heads(8), expect="greater", paper_effect=effect(32),
           earlier_looks=LOOKS[scale]),
  ]


def get_config(scale=None):
  """The char LM; get_sweep varies model.num_heads (and model.head_dim) and the seed.

    python experiments/sweep.py --config=configs/ablations/heads.py --scale=medium \\
        --workdir=runs/ablations/heads_medium --parallel=2

  Points: 20 smoke, 42 medium (7 seeds for the claims' arms 1, 8 and 32 heads), 30 full.
  Expected runtime: docs/ablations.md (each sweep's results line gives the runtime its points
  recorded, and on which device); full: one GPU, not measured.
  Results and verdicts: docs/ablations.md (from docs/ablations/results/heads_<scale>.jsonl).
  """
  return _lm.char_lm(_lm.check_scale(scale, "heads.py"))


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "heads.py")
  d_k = get_config(scale).model.d_model // 4
  others = tuple(h for h in HEADS if h not in CLAIM_HEADS)
  return (sweep.product({"model.num_heads": CLAIM_HEADS, "seed": CLAIM_SEEDS[scale]})
          + sweep.product({"model.num_heads": others, "seed": SEEDS[scale]})
          + sweep.product({"model.num_heads": FIXED_DK_HEADS, "model.head_dim": (d_k,),
                           "seed": SEEDS[scale]}))


def evaluate_point(config, workdir):
  from tfjax.training.accounting import params  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from tfjax.data.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  model = dict(config.model)
  model["vocab_size"] = load_tokenizer(workdir).vocab_size  # 0 in the config: "from the data"
  counts = params.count_by_category(ModelConfig.from_config(model))
  return {"params/attention": counts["attention"], "params/total": sum(counts.values())}
