"""Funnel Transformer (tfjax/nn/funnel.py) masked language modelling on synthetic motifs
(tfjax/modalities/synthetic.py `motifs`), CPU.

Rows of 32 tokens: [CLS] then a random motif of 8 symbols with period 3, 4 or 5, repeated;
15% of tokens masked. FunnelForMaskedLM's layout: three blocks of 2 layers (sequence 32 -> 16
-> 8), mean pooling with separate [CLS] and truncation, relative_shift attention, 2 decoder
layers after the up-sampling; d_model 64, 4 heads of 16, AdamW 3e-3.
"""

import ml_collections


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run.

    python experiments/train_modality.py --config=configs/funnel_synthetic.py --workdir=runs/funnel

  Measured (docs/modalities.md): see the table there for loss and accuracy.
  """
  if arg not in (None, "", "test"):
    raise ValueError(f"configs/funnel_synthetic.py takes no argument or 'test', got {arg!r}")
  test = arg == "test"
  config = ml_collections.ConfigDict()
  config.task = "funnel"
  config.model = dict(vocab_size=16, block_sizes=(1, 1, 1) if test else (2, 2, 2),
                      num_decoder_layers=1 if test else 2, d_model=32 if test else 64,
                      n_head=4, d_head=8 if test else 16, d_inner=64 if test else 128,
                      ffn="gelu_tanh", pooling="mean", attention_type="relative_shift",
                      separate_cls=True, truncate_seq=True, pool_q_only=True, mlm_head=True,
                      init_std=0.02)
  config.data = dict(seq_len=32, symbols=8, periods=(3, 4, 5), mask_rate=0.15)
  config.train = dict(num_steps=60 if test else 300, batch_size=32, learning_rate=3e-3,
                      warmup_steps=10 if test else 30, weight_decay=0.01, seed=0,
                      log_every=20 if test else 50, eval_batches=2 if test else 16)
  return ml_collections.ConfigDict(config)
