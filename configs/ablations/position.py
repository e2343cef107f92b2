"""Position encodings, extrapolation of a language model (Press et al. 2021, figure 1 analog).

none (NoPE) / sinusoidal / learned / rope / alibi, each a char-level Tiny Shakespeare LM trained at
context L (64 smoke, 256 full; configs/ablations/_char_lm.py otherwise), then evaluated at L, 2L,
4L and 8L on the first 256 x L validation tokens with nonoverlapping and sliding-window evaluation
(tfjax/research/length_eval.py). Learned positions have no embedding past L: n/a.
Length generalization on synthetic tasks is configs/ablations/position_lengthgen.py.

Published (Press, Smith & Lewis 2021, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", figure 1, WikiText-103, trained at L = 512 / 1024): the
sinusoidal model's perplexity explodes as soon as the context exceeds L; rotary extrapolates a
little and then degrades; T5's relative bias extrapolates further; ALiBi's perplexity stays flat
up to many times L.
"""
import os

from tfjax.research import sweep

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))
POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")
MULTIPLES = (1, 2, 4, 8)
SEEDS = {"smoke": (0, 1), "full": (0, 1, 2)}
_PLOT = {"x": "@", "lines": ("model.position",), "logy": True}
REPORT = dict(
    metrics=["eval/loss", "long/ppl_nonoverlap", "long/ppl_sliding"],
    plots=[{"metric": "long/ppl_nonoverlap", **_PLOT,
            "title": "perplexity vs context (nonoverlapping); trained at the first"},
           {"metric": "long/ppl_sliding", **_PLOT,
            "title": "perplexity vs context (sliding window); trained at the first"}])


def get_config(scale=None):
  """The char LM trained at context L; get_sweep varies model.position and the seed.

    python experiments/sweep.py --config=configs/ablations/position.py --scale=smoke \
        --workdir=runs/ablations/position

  Expected (smoke, 2 seeds, docs/ablations.md): long/ppl_nonoverlap from L to 8L stays flat for
  alibi (8.04 -> 7.96), rises slowly for none (10.6 -> 12.0), rises past 2L for rope
  (7.3 -> 14.3) and explodes past L for sinusoidal (17 at L, 66 at 2L); learned is n/a past L.
  """
  return _lm.char_lm(_lm.check_scale(scale, "position.py"))


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "position.py")
  return sweep.product({"model.position": POSITIONS, "seed": SEEDS[scale]})


def evaluate_point(config, workdir):
  from tfjax.research import length_eval  # pylint: disable=import-outside-toplevel  (jax only here)
  return length_eval.perplexity_vs_length(workdir, MULTIPLES, max_tokens=256 * config.data.seq_len)
