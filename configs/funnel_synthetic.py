"""Funnel Transformer (tfjax/nn/funnel.py) masked language modelling on synthetic motifs
(tfjax/modalities/synthetic.py `motifs`), CPU: task 'funnel' (tfjax/training/tasks/funnel.py)
through the main loop; `:classify` is task 'funnel_classification'
(FunnelForSequenceClassification's head): which of 3 symbol groups dominates a row.

Rows of 32 tokens: [CLS] then a random motif of 8 symbols with period 3, 4 or 5, repeated;
15% of tokens masked. FunnelForMaskedLM's layout: three blocks of 2 layers (sequence 32 -> 16
-> 8), mean pooling with separate [CLS] and truncation, relative_shift attention, 2 decoder
layers after the up-sampling; d_model 64, 4 heads of 16, AdamW 3e-3.
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run, 'classify' (or 'classify_test') the
  classification task.

    python experiments/train.py --config=configs/funnel_synthetic.py --workdir=runs/funnel

  Measured (docs/modalities.md): see the table there for loss and accuracy.
  """
  if arg not in ("test", "classify", "classify_test"):
    refuse_argument("configs/funnel_synthetic.py", arg,
                    "no argument, 'test', 'classify' or 'classify_test'")
  test = arg in ("test", "classify_test")
  classify = arg in ("classify", "classify_test")
  config = base_config("funnel_classification" if classify else "funnel")
  config.model.update(vocab_size=16, block_sizes=(1, 1, 1) if test else (2, 2, 2),
                      d_model=32 if test else 64, n_head=4, d_head=8 if test else 16,
                      d_inner=64 if test else 128, ffn="gelu_tanh", pooling="mean",
                      attention_type="relative_shift", separate_cls=True, truncate_seq=True,
                      pool_q_only=True, init_std=0.02)
  if classify:
    config.model.update(decoder=False, num_decoder_layers=0, mlm_head=False, num_classes=3)
    config.data.classes = 3
  else:
    config.model.update(num_decoder_layers=1 if test else 2, mlm_head=True)
    config.data.update(periods=(3, 4, 5), mask_rate=0.15)
  config.data.update(seq_len=32, num_symbols=8)
  steps = 60 if test else 300
  config.optimizer.update(lr=3e-3, min_lr=3e-4, warmup_steps=10 if test else 30,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=32,
                      eval_batches=2 if test else 16, eval_every=steps,
                      log_every=20 if test else 50, checkpoint_every=steps)
  return config
