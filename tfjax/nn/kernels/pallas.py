"""`implementation='pallas'`: the Pallas flash-attention kernel for the platform it runs on.

  tpu       Mosaic TPU kernels (flash_attention_tpu.py)
  gpu, cpu  Triton kernels (flash_attention.py; interpreted on CPU)
The TPU kernels also run on CPU through TPU interpret mode, but only when called directly
(`flash_attention_tpu(..., interpret=True)`, as their tests do): on CPU 'pallas' means the
Triton kernels' interpreter.

A program traced on a CPU host may be compiled for TPU or GPU devices instead (ahead of time,
tfjax.aot): there the choice is made when lowering, by `jax.lax.platform_dependent`, so a TPU
program carries the Mosaic kernels and a GPU program the compiled Triton ones
(`per_lowering_platform`).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax

from tfjax.nn.kernels.flash_attention import flash_attention
from tfjax.nn.kernels.flash_attention_tpu import flash_attention_tpu


def pallas_kernel_for_backend(backend: str):
  """The flash-attention function 'pallas' runs on `backend` ('tpu', 'gpu' or 'cpu')."""
  return flash_attention_tpu if backend == "tpu" else flash_attention


def _accepts(kernel: Callable, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, kwargs) -> bool:
  """Whether `kernel` takes these inputs (a head_dim, dtype or argument it lacks raises
  ValueError while tracing): only such kernels become a platform's branch."""
  arrays = {name: x for name, x in kwargs.items() if hasattr(x, "shape")}
  static = {name: x for name, x in kwargs.items() if name not in arrays}
  try:
    qkv = (q_BxTxHxE, k_BxSxKxE, v_BxSxKxE)
    jax.eval_shape(lambda qkv, kw: kernel(*qkv, **kw, **static), qkv, arrays)
    return True
  except ValueError:
    return False


def per_lowering_platform(default: Callable, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs):
  """`default(q, k, v, **kwargs)` on CPU, the compiled Mosaic kernel when the program is lowered
  for TPU and the compiled Triton kernel when lowered for CUDA (each only if it accepts these
  inputs; else `default` there too). Only the lowered platform's branch reaches the compiler."""
  branches = {}
  for platform, kernel in (("tpu", flash_attention_tpu), ("cuda", flash_attention)):
    compiled = functools.partial(kernel, interpret=False)
    if _accepts(compiled, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, kwargs):
      branches[platform] = functools.partial(compiled, **kwargs)
  return jax.lax.platform_dependent(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE,
                                    default=functools.partial(default, **kwargs), **branches)


def pallas_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs):
  """`tfjax.nn.ops.dot_product_attention` semantics with the Pallas kernel of the platform: the
  default backend's, or on a CPU host the one of the platform the program is lowered for."""
  backend = jax.default_backend()
  if backend != "cpu":
    return pallas_kernel_for_backend(backend)(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)
  return per_lowering_platform(flash_attention, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)
