"""Fused attention implementations; importing this package registers them with tfjax.ops.

  chunked  plain-JAX flash attention (O(L) memory; the CPU choice for long sequences)
  pallas   Pallas FlashAttention-2 kernels (Triton on NVIDIA GPUs, interpreted on CPU)
  cudnn    cuDNN flash attention via jax.nn.dot_product_attention (GPU only)
"""

from tfjax import ops
from tfjax.kernels.chunked import chunked_attention
from tfjax.kernels.cudnn import cudnn_attention
from tfjax.kernels.flash_attention import flash_attention

ops.register_implementation("chunked", chunked_attention)
ops.register_implementation("pallas", flash_attention)
ops.register_implementation("cudnn", cudnn_attention)

__all__ = ["chunked_attention", "cudnn_attention", "flash_attention"]
