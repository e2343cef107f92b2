"""`implementation='pallas'`: the Pallas flash-attention kernel for this backend.

  tpu       Mosaic TPU kernels (flash_attention_tpu.py)
  gpu, cpu  Triton kernels (flash_attention.py; interpreted on CPU)
The TPU kernels also run on CPU through TPU interpret mode, but only when called directly
(`flash_attention_tpu(..., interpret=True)`, as their tests do): on CPU 'pallas' keeps meaning the
Triton kernels' interpreter, as it did before the TPU kernels existed.
"""

from __future__ import annotations

import jax

from tfjax.nn.kernels.flash_attention import flash_attention
from tfjax.nn.kernels.flash_attention_tpu import flash_attention_tpu


def pallas_kernel_for_backend(backend: str):
  """The flash-attention function 'pallas' runs on `backend` ('tpu', 'gpu' or 'cpu')."""
  return flash_attention_tpu if backend == "tpu" else flash_attention


def pallas_attention(q, k, v, **kwargs):
  """`tfjax.nn.ops.dot_product_attention` semantics with the Pallas kernel of the default backend."""
  return pallas_kernel_for_backend(jax.default_backend())(q, k, v, **kwargs)
