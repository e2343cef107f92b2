"""Logical axis names and shape letters: defined here once, used everywhere.

Logical axis names label each array dimension for sharding: `tfjax.training.parallel.sharding` maps
them to mesh axes. Blocks use these constants, never the strings, so that a typo is a NameError
instead of an unknown name that the rules silently leave replicated.

Shape letters: an array's name ends in its shape, one letter per dimension (`x_BxLxD`), with the
letters below in every module of the library and its tests.

  B  batch (decoding: prompts)
  L  sequence length (the tokens of one sequence)
  T  query length, S key/value length (attention; S is the encoder length for cross-attention)
  D  model width (d_model)
  H  query heads, K key/value heads, G query heads per key/value head (H / K)
  E  width of one head (head_dim)
  F  feed-forward width (d_ff)
  A  rotation angles per position (sinusoidal: D / 2, RoPE: E / 2)
  V  vocabulary
  U  relative-position buckets (T5's bias table, tfjax/nn/relative_bias.py)
  decoding (tfjax/inference/decode.py): P padded prompt length, N new tokens, M sequences per prompt
     (num_samples), R = B * M decoded rows, W beams, C beam candidates
"""

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"        # D: the residual stream, embeddings, norms
HEADS = "heads"        # H
KV_HEADS = "kv_heads"  # K: key/value projections and caches (== H for multi-head attention)
HEAD_DIM = "head_dim"  # E
MLP = "mlp"            # F
VOCAB = "vocab"        # V
LAYERS = "layers"      # the leading axis of parameters stacked by nn.scan

# The residual stream between sublayers, x_BxLxD.
RESIDUAL_STREAM = (BATCH, LENGTH, EMBED)
