"""Position encodings, length generalization on synthetic tasks (Kazemnejad et al. 2023).

A decoder-only model per (task, position encoding, seed): copy, reverse and addition, trained on
instance lengths 1..N and evaluated by exact match (every answer token right; teacher-forced argmax,
which equals greedy decoding) at lengths up to 2N. Smoke: N = 8, lengths 4..16, 2 layers x 64,
400 steps; full: N = 16, lengths 8..32, 4 layers x 128, 5000 steps. The learned table covers every
evaluated row (max_len), but positions past the training lengths are never trained.

Published (Kazemnejad, Padhi, Natesan Ramamurthy, Das & Reddy 2023, "The Impact of Positional
Encoding on Length Generalization in Transformers", figures 1 and 3): on such tasks (copy,
reverse, addition, ...) trained on short instances, NoPE (no position encoding) generalizes to
longer ones best, T5's relative bias next, while ALiBi, rotary and absolute encodings are worse.
"""
from tfjax.research import sweep
from tfjax.training.defaults import base_config

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")
TASKS = ("copy", "reverse", "addition")
SEEDS = {"smoke": (0, 1), "full": (0, 1, 2)}
REPORT = dict(
    metrics=["eval/exact_match", "eval/loss"],
    plots=[{"metric": "eval/exact_match", "x": "@", "lines": ("model.position",),
            "panels": "data.name", "title": "exact match vs instance length (trained on <= N)"}])


def _scale(scale):
  scale = scale or "smoke"
  if scale not in ("smoke", "full"):
    raise ValueError(f"position_lengthgen.py takes scale 'smoke' or 'full', got {scale!r}")
  return scale


def get_config(scale=None):
  """The copy task at position 'none'; get_sweep varies data.name, model.position and the seed.

    python experiments/sweep.py --config=configs/ablations/position_lengthgen.py --scale=smoke \
        --workdir=runs/ablations/position_lengthgen

  Expected (smoke, 2 seeds, docs/ablations.md): no encoding generalizes past the training
  lengths (eval/exact_match@12 and @16 are 0 for every task and encoding); in distribution,
  learned, rope and alibi solve copy at length 4 (1.0) and no model learns addition.
  """
  smoke = _scale(scale) == "smoke"
  n = 8 if smoke else 16
  config = base_config()
  config.task = "lm"
  config.data.update(name="copy", form="decoder", train_lengths=(1, n), num_symbols=16,
                     test_lengths=tuple(range(n // 2, 2 * n + 1, n // 2)))
  config.model.update(
      family="decoder", vocab_size=0, d_model=64 if smoke else 128, num_layers=2 if smoke else 4,
      num_heads=4, d_ff=256 if smoke else 512, ffn="gelu", norm="layernorm",
      norm_placement="pre", position="none",
      max_len=64 if smoke else 128,  # addition at 2N: 3 * 2N + 4 tokens
      dropout=0.0)
  config.optimizer.update(name="adamw", lr=3e-3 if smoke else 1e-3, b2=0.98, weight_decay=0.01,
                          schedule="cosine", warmup_steps=40 if smoke else 500, min_lr=1e-4,
                          clip_norm=1.0)
  config.train.update(num_steps=400 if smoke else 5000, batch_size=32 if smoke else 64,
                      eval_batch_size=64, eval_batches=2 if smoke else 8,
                      eval_every=200 if smoke else 1000, log_every=50 if smoke else 250,
                      checkpoint_every=400 if smoke else 1000, keep_checkpoints=1)
  return config


def get_sweep(scale=None):
  return sweep.product({"data.name": TASKS, "model.position": POSITIONS,
                        "seed": SEEDS[_scale(scale)]})
