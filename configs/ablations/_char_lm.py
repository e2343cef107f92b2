"""The character-level Tiny Shakespeare LM that the ffn, heads, norm and position ablations vary.

Not a sweep itself: the ablations load it with tfjax.research.sweep.load_module and change one thing.
  smoke   2 layers x 64, 4 heads, context 64, batch 16, 600 steps: sized for a CPU, enough to rank
          clear differences only
  medium  4 layers x 64, 4 heads, context 64, batch 32, 1500 steps (5x smoke's tokens, 2x its
          depth): a 3-seed sweep of 6 arms fits in an hour on 2 CPU cores
  full    nanoGPT's shakespeare-char model (6 layers x 384, 6 heads, context 256, batch 64,
          dropout 0.2) for 3000 steps: sized for one GPU
Sweep run times: docs/ablations.md.
Pre-LN LayerNorm, GELU, learned positions, tied embeddings, AdamW with cosine decay (as
configs/shakespeare_char.py).
"""
from tfjax.training.config.defaults import base_config

SCALES = ("smoke", "medium", "full")


def check_scale(scale, module: str) -> str:
  scale = scale or "smoke"
  if scale not in SCALES:
    raise ValueError(f"{module} takes scale 'smoke', 'medium' or 'full', got {scale!r}")
  return scale


T5_MAX_DISTANCE = 128  # Raffel et al. 2020, section 2.1: 32 buckets up to an offset of 128


def position_arms(positions, seeds, **settings) -> list:
  """Sweep points {settings..., model.position, seed}. The arms differ in the position encoding
  alone: the embedding protocol (token scaling, tables, T5's max distance) is the config's and
  the same for every arm, as each compared paper ran its arms (one model, one encoding swapped)."""
  return [{**settings, "model.position": position, "seed": seed}
          for position in positions for seed in seeds]


def char_lm(scale: str):
  if scale == "medium":
    return _medium(char_lm("smoke"))
  smoke = scale == "smoke"
  config = base_config()
  config.task = "lm"
  config.data.update(name="tinyshakespeare", tokenizer="char", seq_len=64 if smoke else 256,
                     mode="random", eval_mode="random", val_fraction=0.1)
  config.model.update(
      family="decoder", vocab_size=0, d_model=64 if smoke else 384, num_layers=2 if smoke else 6,
      num_heads=4 if smoke else 6, d_ff=256 if smoke else 1536, ffn="gelu", norm="layernorm",
      norm_placement="pre", position="learned", max_len=64 if smoke else 256,
      tie_embeddings=True, dropout=0.0 if smoke else 0.2)
  config.optimizer.update(name="adamw", lr=3e-3 if smoke else 1e-3, b2=0.99, weight_decay=0.1,
                          decay_exclude=("norms", "biases"), clip_norm=1.0, schedule="cosine",
                          warmup_steps=30 if smoke else 100, min_lr=3e-4 if smoke else 1e-4)
  config.train.update(
      num_steps=600 if smoke else 3000, batch_size=16 if smoke else 64,
      eval_batch_size=32 if smoke else 64, eval_batches=8 if smoke else 50,
      eval_every=200 if smoke else 500, log_every=25 if smoke else 100,
      checkpoint_every=600 if smoke else 1000, keep_checkpoints=1)
  return config


def _medium(config):
  config.model.update(num_layers=4)
  config.train.update(num_steps=1500, batch_size=32, eval_batches=16, eval_every=500,
                      log_every=50, checkpoint_every=500)
  config.optimizer.update(warmup_steps=75)
  return config
