"""Fused attention implementations behind `tfjax.nn.ops.dot_product_attention(implementation=...)`.

  chunked  plain-JAX flash attention (O(L) memory; the CPU choice for long sequences)
  pallas   Pallas FlashAttention-2 kernels (Triton on NVIDIA GPUs, interpreted on CPU)
  cudnn    cuDNN flash attention via jax.nn.dot_product_attention (GPU only)

`IMPLEMENTATIONS` is the table tfjax.nn.ops reads (lazily, so that importing ops never imports
Pallas). The kernels import only tfjax.nn.masks, never tfjax.nn.ops.
"""

from tfjax.nn.kernels.chunked import chunked_attention
from tfjax.nn.kernels.cudnn import cudnn_attention
from tfjax.nn.kernels.flash_attention import flash_attention

IMPLEMENTATIONS = {
    "chunked": chunked_attention,
    "pallas": flash_attention,
    "cudnn": cudnn_attention,
}

__all__ = ["IMPLEMENTATIONS", "chunked_attention", "cudnn_attention", "flash_attention"]
