"""Initializers of the dense matrices (attention W_Q, W_K, W_V, W_O; FFN; untied LM head), chosen by
`model.init`.

  normal          N(0, std^2), std = model.init_std (GPT-2, BERT: 0.02), or the residual std for
                  the matrices that write into the residual stream (model.scaled_residual_init)
  xavier_uniform  U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010), as in
                  the original Transformer (tensor2tensor's default initializer): fan_in is the
                  size of what the matrix reads, fan_out of what it writes, so W_Q of a d_model ->
                  heads x head_dim projection has fan_in = d_model, fan_out = heads * head_dim,
                  the same bound as the d_model x d_model matrix of the paper

`gain` is DeepNet's beta (tfjax/nn/norms.py): it multiplies the std of the normal init and the
bound of the Xavier one (Wang et al. 2022 scale Xavier's gain the same way). Embedding tables
are not dense matrices: they keep their normal init (tfjax/nn/models.py, positions.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

import flax.linen as nn

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

Axes = Union[int, Sequence[int]]


def kernel_init(cfg: ModelConfig, std: float, *, gain: float = 1.0, in_axis: Axes = -2,
                out_axis: Axes = -1):
  """The initializer of one dense kernel: `in_axis` / `out_axis` name the kernel dimensions that
  are read / written (e.g. (0, 1) for W_O [heads, head_dim, d_model]); only Xavier uses them."""
  if cfg.init == "xavier_uniform":
    # variance_scaling(s, fan_avg, uniform) draws U(-a, a), a = sqrt(3 s / ((fan_in+fan_out)/2))
    # = sqrt(s) * sqrt(6 / (fan_in + fan_out)): s = gain^2 gives Glorot's bound times gain.
    return nn.initializers.variance_scaling(gain ** 2, "fan_avg", "uniform", in_axis=in_axis,
                                            out_axis=out_axis)
  return nn.initializers.normal(std * gain)
