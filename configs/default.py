"""Default run: a 2-layer decoder learns to reverse sequences (synthetic, no network, no files).

Trains on lengths 1..16 and evaluates exact match at 8 and 16 (in distribution) and at 24 and 32
(length generalization: RoPE positions past the training lengths were never trained, so these
stay near 0). Small and synthetic, so that `python experiments/train.py` with no flags trains it
on any CPU and shows the whole system working.
"""
from tfjax.defaults import base_config


def get_config(arg=None):
  """The reverse task, 600 steps.

    python experiments/train.py --workdir=runs/default      # no --workdir: runs/default-<time>/

  Expected at step 600: eval/exact_match@8 1.00 and @16 0.97-1.00 (float rounding changes the
  trajectory between versions; 0.996 at the last measurement), @24 and @32 0.
  Run times: docs/benchmarks.md.
  """
  del arg
  config = base_config()
  config.task = "lm"
  config.data.update(name="reverse", form="decoder", train_lengths=(1, 16),
                     test_lengths=(8, 16, 24, 32), num_symbols=16)
  config.model.update(
      family="decoder", vocab_size=0, d_model=128, num_layers=2, num_heads=4, d_ff=512,
      ffn="gelu", norm="layernorm", norm_placement="pre", position="rope", max_len=128,
      dropout=0.0)
  config.optimizer.update(name="adamw", lr=3e-3, b2=0.98, weight_decay=0.01, schedule="cosine",
                          warmup_steps=100, min_lr=1e-4, clip_norm=1.0)
  config.train.update(num_steps=600, batch_size=64, eval_batch_size=128, eval_batches=2,
                      eval_every=200, log_every=50, checkpoint_every=200)
  config.mesh.cpu_devices = -1  # CPU: one XLA device per core, the batch split over them
  return config
