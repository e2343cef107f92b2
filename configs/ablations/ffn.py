"""FFN ablation: ReLU / GELU / SwiGLU / GeGLU at a matched parameter count (Shazeer 2020).

The gated variants have three matrices instead of two, so their hidden width is 2/3 of the
ungated one (d_ff = 4 d and 8 d / 3): every FFN then holds 8 d^2 weights (no FFN biases, as in
Shazeer's experiments). d_model is 96 (smoke) / 384 (full) so that 8 d / 3 is a whole number.
evaluate_point records the exact parameter counts (params/ffn, params/total) to show the match.

Published (Shazeer 2020, "GLU Variants Improve Transformer", table 1, T5-base on C4 after 65k
steps, log-perplexity): ReLU 1.997, GELU 1.983, SwiGLU 1.944, GeGLU 1.942 -- the gated variants
win by ~0.05 nats, GELU beats ReLU slightly. Our char-level runs are much smaller; see
docs/ablations.md.
"""
import os

from tfjax.research import sweep

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))
SEEDS = {"smoke": (0, 1), "full": (0, 1, 2)}
REPORT = dict(
    metrics=["eval/loss", "eval/perplexity", "params/ffn", "params/total", "diverged"],
    plots=[{"metric": "eval/loss", "lines": ("model.ffn",)},
           {"curve": "eval/loss", "lines": ("model.ffn",)}])


def get_config(scale=None):
  """The char LM without FFN biases at d_model 96 / 384; get_sweep varies model.ffn and d_ff.

    python experiments/sweep.py --config=configs/ablations/ffn.py --scale=smoke \
        --workdir=runs/ablations/ffn

  Expected (smoke, 2 seeds, docs/ablations.md): params/ffn 147,456 for all four; eval/loss
  relu 2.05, gelu 2.09, swiglu 2.17 ± 0.16, geglu 2.15 ± 0.16 (at 600 steps the gated FFNs are
  behind, with a large seed spread).
  """
  scale = _lm.check_scale(scale, "ffn.py")
  config = _lm.char_lm(scale)
  d_model = 96 if scale == "smoke" else 384
  config.model.update(d_model=d_model, d_ff=4 * d_model, ffn_bias=False)
  return config


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "ffn.py")
  d_model = get_config(scale).model.d_model
  width = {"relu": 4 * d_model, "gelu": 4 * d_model,
           "swiglu": 8 * d_model // 3, "geglu": 8 * d_model // 3}
  return [{"model.ffn": ffn, "model.d_ff": width[ffn], "seed": seed}
          for ffn in width for seed in SEEDS[scale]]


def evaluate_point(config, workdir):
  from tfjax.training import params  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from tfjax.training.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  model = dict(config.model)
  model["vocab_size"] = load_tokenizer(workdir).vocab_size  # 0 in the config: "from the data"
  counts = params.count_by_category(ModelConfig.from_config(model))
  return {"params/ffn": counts["ffn"], "params/total": sum(counts.values())}
