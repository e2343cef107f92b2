"""Tiny config for the scale-out tests (tests/training/test_sharding.py, tests/runtime/test_multiprocess.py).

A config file (`--config=tests/scaleout_config.py`) so the multi-process test can start the real
CLI. 2 layers, 4 heads, d_ff and vocabulary divisible by 4, batch 8: every mesh of 8 devices splits
every axis evenly. Five steps, no eval before the end, checkpoints at step 3 and 5.
"""
from tfjax.training.config.defaults import base_config


def get_config(arg=None):
  del arg
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(6,),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=16, d_model=32, num_layers=2, num_heads=4,
                      d_ff=64, position="rope", max_len=64, ffn="swiglu", norm="rmsnorm",
                      attention_bias=False, ffn_bias=False, tie_embeddings=False)
  config.optimizer.update(lr=3e-3, warmup_steps=2, min_lr=1e-4)
  config.train.update(num_steps=5, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=1000, log_every=1, checkpoint_every=3, eval_at_start=False)
  return config
