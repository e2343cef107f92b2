"""nanoGPT's GPT-2 124M on OpenWebText (Karpathy, config/train_gpt2.py), from a prepared corpus.

Model: 12 layers x 768, 12 heads, context 1024, vocabulary padded to 50,304 (nanoGPT's; GPT-2's
tokenizer has 50,257 ids), no biases, exact GELU, pre-LN, learned positions, tied head, GPT-2's
residual-projection init, dropout 0. Batch: 480 rows = 491,520 tokens (~0.5M) per optimizer step,
in micro-batches of 12 rows x 1024 tokens per device. AdamW lr 6e-4, betas (0.9, 0.95), weight
decay 0.1 on matrices and embeddings, grad clip 1.0, 2,000 warmup steps then cosine to 6e-5 at
600,000 steps. Eval: 200 random batches of 12 rows per device every 1,000 steps.

Derived from the device count (the D batch shards: devices on mesh data x fsdp), at setup and
recorded in the run's config.json: optimizer.grad_accum_steps = 480 / (12 x D) and
train.eval_batch_size = 12 x D (train.micro_batch_per_device=12, both keys -1 here). So one GPU
accumulates 40 micro-batches of 12 rows and 8 GPUs 5 of 96 rows (nanoGPT's 8-GPU run), with the
same command. An explicit --config.optimizer.grad_accum_steps or --config.train.eval_batch_size
wins. Where 40 is not a multiple of D (e.g. 7 or 12 GPUs) setup stops before compiling, naming
the fix: a smaller --config.train.micro_batch_per_device that keeps 480 rows a step where one
exists (10 on 12 GPUs), else --config.train.batch_size a multiple of 12 x D (504 or 420 on 7).
"""
from tfjax.training.config.defaults import base_config


def get_config(arg=None):
  """The recipe, or with arg 'smoke' the same recipe shrunk to seconds on a CPU (CI).

    tfjax-prepare --input='openwebtext/*.jsonl.zst' --tokenizer=gpt2 --output=data/owt \
        --val_fraction=0.0005            # GPT-2's tokenizer.json on disk: tfjax/data/tokenizer_spec.py
    python experiments/train.py --config=configs/gpt2_owt.py --workdir=runs/gpt2_owt \
        --config.data.path=data/owt      # on 1 GPU or 8 (or any count dividing 40): see above

    python -m tfjax.params --config=configs/gpt2_owt.py   # last line "total: 124373760"
                      # (nanoGPT prints 123.59M: the same less the 1024 x 768 position table)

  Expected: nanoGPT's README reports ~2.85 val loss after about 4 days on one 8xA100 40GB node
  (600k steps); not yet measured with tfjax. `smoke` (tests/training/test_gpt2_owt.py): a 2-layer x 64
  model, 64-token rows, 8 rows a step in micro-batches of 4 rows per device (2 on one device), 6
  steps, any prepared directory.
  """
  if arg not in (None, "", "smoke"):
    raise ValueError(f"configs/gpt2_owt.py takes no argument or 'smoke', got {arg!r}")
  smoke = arg == "smoke"
  config = base_config()
  config.task = "lm"
  config.data.update(name="prepared", path="", seq_len=64 if smoke else 1024, mode="random",
                     eval_mode="random", expect_tokenizer="" if smoke else "gpt2")
  config.model.update(
      family="decoder", vocab_size=0 if smoke else 50304, d_model=64 if smoke else 768,
      num_layers=2 if smoke else 12, num_heads=2 if smoke else 12, d_ff=256 if smoke else 3072,
      ffn="gelu", ffn_bias=False, attention_bias=False, norm="layernorm", norm_bias=False,
      norm_placement="pre", position="learned", max_len=64 if smoke else 1024,
      tie_embeddings=True, scaled_residual_init=True, dropout=0.0)
  config.optimizer.update(name="adamw", lr=6e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
                          decay_exclude=("norms", "biases"), clip_norm=1.0, schedule="cosine",
                          warmup_steps=2 if smoke else 2000, min_lr=6e-5,
                          grad_accum_steps=-1)  # 480 / (12 x D) on D batch shards
  config.train.update(num_steps=6 if smoke else 600_000, batch_size=8 if smoke else 480,
                      micro_batch_per_device=4 if smoke else 12,
                      eval_batch_size=-1, eval_batches=2 if smoke else 200,  # 12 x D
                      eval_every=3 if smoke else 1000, log_every=1 if smoke else 10,
                      checkpoint_every=3 if smoke else 1000, eval_at_start=not smoke,
                      sample_tokens=0)
  return config
