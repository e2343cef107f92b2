"""An encoder classifier with an efficient attention kind: ListOps (Long Range Arena's task,
tfjax/data/listops.py), pooled [CLS], 10 classes. KIND is longformer, bigbird, linformer,
performer or softmax.

    python experiments/train.py --config=configs/efficient_encoder.py:longformer \\
        --workdir=runs/longformer

Longformer, BigBird and Linformer are encoder-only kinds (the default config is a decoder, which
they refuse); this config is the one command that trains each. Rows are N + 1 = 64 tokens
([CLS] + an expression of N // 4 .. N = 63 tokens), 2 layers x 64, 600 steps (a few minutes on a
2-core CPU). Each kind's own keys are sized to the row: Longformer's two-sided window 16 with
the [CLS] token global, BigBird blocks of 4, Linformer's projections to k = 16; override any of
them with --config.model.<key>=... A smaller run (what tests/training/test_efficient_encoder.py
runs): --config.train.num_steps=6 --config.model.d_model=32 --config.model.num_layers=1
--config.train.log_every=1.

The same model trained per kind and seed, against published numbers:
configs/ablations/lra_listops.py (docs/ablations.md).
"""
from tfjax.training.config.defaults import base_config

ROW = 64  # [CLS] + up to 63 expression tokens
KINDS = {
    "longformer": {"longformer_window": ROW // 4, "longformer_global_tokens": 1},
    "bigbird": {"bigbird_block_size": ROW // 16},
    "linformer": {"linformer_k": ROW // 4},
    "performer": {"performer_features": ROW // 2},
    "softmax": {},
}


def get_config(arg=None):
  """configs/efficient_encoder.py:KIND (see the module docstring)."""
  if arg not in KINDS:
    raise ValueError(f"configs/efficient_encoder.py takes the attention kind as its argument, "
                     f"one of {', '.join(KINDS)} (e.g. configs/efficient_encoder.py:longformer); "
                     f"got {arg!r}")
  n = ROW - 1
  config = base_config()
  config.task = "classification"
  config.data.update(name="listops", train_lengths=(n, n), test_lengths=(n,))
  config.model.update(
      family="encoder", vocab_size=0, d_model=64, num_layers=2, num_heads=4, d_ff=128,
      ffn="gelu", norm="layernorm", norm_placement="pre", position="learned", max_len=ROW,
      pooler=True, num_classes=10, mlm_head=False, type_vocab_size=0, dropout=0.0,
      attention_kind=arg, **KINDS[arg])
  config.optimizer.update(name="adamw", lr=3e-3, b2=0.98, weight_decay=0.01, schedule="cosine",
                          warmup_steps=2, min_lr=1e-4, clip_norm=1.0)
  config.train.update(num_steps=600, batch_size=32, eval_batch_size=64, eval_batches=2,
                      eval_every=300, log_every=25, checkpoint_every=300, keep_checkpoints=1)
  return config
