"""Position-wise feed-forward: two matrices (relu, gelu, gelu_tanh, silu) or gated with three
(Shazeer 2020, "GLU Variants Improve Transformer", equations 5-6):
  glu       W2 (sigmoid(x W) * x V)      (Dauphin et al. 2017's GLU)
  bilinear  W2 ((x W) * x V)             (no nonlinearity)
  reglu, geglu, geglu_tanh, swiglu: the gate through relu, gelu, tanh-gelu, swish (silu).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.choices import one_of
from tfjax.nn.inits import kernel_init
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


def gelu(x, approximate: bool = False):
  """GELU x * Phi(x) (Hendrycks & Gimpel), the one GELU of the library.

  approximate=False: exact, x/2 * (1 + erf(x / sqrt 2)); written with erf, not jax.nn.gelu's erfc
    form (the same function to < 1e-7 absolute): erf is one vectorized polynomial, erfc adds an
    exp and divisions (docs/benchmarks/cpu_training.md). BERT, and `model.ffn='gelu'`.
  approximate=True: the tanh approximation x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))),
    which GPT-2 (`gelu_new`), Gemma and T5 v1.1 (`gelu_pytorch_tanh`) were trained with.
  """
  if approximate:
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + jnp.tanh(inner))
  return 0.5 * x * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)))


gelu_tanh = functools.partial(gelu, approximate=True)

# The nonlinearity of each `model.ffn`; the gated kinds apply it to the gate.
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "silu": jax.nn.silu,
    # CLIP's x * sigmoid(1.702 x) (Hendrycks & Gimpel's sigmoid approximation of GELU).
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "swiglu": jax.nn.silu,
    "geglu": gelu,
    "geglu_tanh": gelu_tanh,
    "reglu": jax.nn.relu,
    "glu": jax.nn.sigmoid,
    "bilinear": lambda x: x,
}
FFNS = tuple(ACTIVATIONS)
# Gated (three matrices, Shazeer 2020): W2 (act(W_gate x) * W1 x); the others W2 act(W1 x).
GATED_FFNS = ("swiglu", "geglu", "geglu_tanh", "reglu", "glu", "bilinear")


@dataclasses.dataclass(frozen=True)
class FfnConfig(Section):
  """activation (model.ffn): relu | gelu (exact erf) | gelu_tanh (GPT-2 gelu_new) | silu | gated
  (three matrices): swiglu | geglu | geglu_tanh | reglu | glu (sigmoid gate) | bilinear (no
  activation). d_ff: the hidden width. bias: biases of every FFN matrix."""
  activation: str = flat_key("ffn", "gelu")
  d_ff: int = 512
  bias: bool = flat_key("ffn_bias", True)

  @property
  def gated(self) -> bool:
    return self.activation in GATED_FFNS

  def validate(self, model) -> None:
    del model
    one_of("model.ffn", self.activation, FFNS)
    if self.d_ff < 1:
      raise ValueError(f"model.d_ff={self.d_ff} must be a positive integer")


def dense(cfg: ModelConfig, features: int, logical_axes, name: str, use_bias: bool,
          init_std: float | None = None, init_gain: float = 1.0):
  """A Dense layer whose kernel and bias carry logical axis names for sharding; kernel init by
  model.init (tfjax/nn/inits.py) with std `init_std` (default model.init_std) and `init_gain`."""
  std = cfg.init_std if init_std is None else init_std
  return nn.Dense(
      features, use_bias=use_bias, dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(kernel_init(cfg, std, gain=init_gain),
                                               logical_axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (logical_axes[-1],)))


class FeedForward(nn.Module):
  """relu/gelu/gelu_tanh/silu: W2 act(W1 x);  gated: W2 (act(W_gate x) * (W1 x)).

  The stack's DeepNorm beta (model.norms.init_gain, tfjax/nn/norms.py) multiplies the init std
  (Xavier: the bound) of every matrix.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    ffn = cfg.feed_forward
    act = ACTIVATIONS[ffn.activation]
    gain = cfg.norms.init_gain
    h_BxLxF = dense(cfg, ffn.d_ff, (axes.EMBED, axes.MLP), "wi", ffn.bias,
                    init_gain=gain)(x_BxLxD)
    if ffn.gated:
      gate_BxLxF = dense(cfg, ffn.d_ff, (axes.EMBED, axes.MLP), "wi_gate", ffn.bias,
                         init_gain=gain)(x_BxLxD)
      h_BxLxF = act(gate_BxLxF) * h_BxLxF
    else:
      h_BxLxF = act(h_BxLxF)
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, (axes.BATCH, axes.LENGTH, axes.MLP))
    return dense(cfg, x_BxLxD.shape[-1], (axes.MLP, axes.EMBED), "wo", ffn.bias,
                 cfg.residual_init_std, init_gain=gain)(h_BxLxF)
