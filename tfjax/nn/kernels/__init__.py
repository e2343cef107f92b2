"""Fused attention implementations behind `tfjax.nn.ops.dot_product_attention(implementation=...)`.

  chunked  plain-JAX flash attention (O(L) memory; the CPU choice for long sequences)
  pallas   Pallas FlashAttention kernels for the backend: Mosaic on TPU (flash_attention_tpu),
           Triton on NVIDIA GPUs (flash_attention; its forward optionally the Mosaic GPU kernel of
           flash_attention_mgpu on Hopper, its backward, opt-in, flash_attention_mgpu_bwd's), the
           Triton ones interpreted on CPU
  cudnn    cuDNN flash attention via jax.nn.dot_product_attention (GPU only)

`IMPLEMENTATIONS` is the table tfjax.nn.ops reads (lazily, so that importing ops never imports
Pallas). The kernels import only tfjax.nn.masks, never tfjax.nn.ops.
"""

from tfjax.nn.kernels.chunked import chunked_attention
from tfjax.nn.kernels.cudnn import cudnn_attention
from tfjax.nn.kernels.flash_attention import flash_attention
from tfjax.nn.kernels.flash_attention_tpu import flash_attention_tpu
from tfjax.nn.kernels.pallas import pallas_attention

IMPLEMENTATIONS = {
    "chunked": chunked_attention,
    "pallas": pallas_attention,
    "cudnn": cudnn_attention,
}

__all__ = ["IMPLEMENTATIONS", "chunked_attention", "cudnn_attention", "flash_attention",
           "flash_attention_tpu", "pallas_attention"]
