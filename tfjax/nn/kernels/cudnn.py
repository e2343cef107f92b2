"""implementation='cudnn': cuDNN flash attention through `jax.nn.dot_product_attention`.

Causal and sliding-window masks are cuDNN's own (so masked tiles are skipped); segment ids become a
boolean mask (jax passes it to cuDNN as a dense bias, i.e. T x S memory). cuDNN aligns causal masks
to the top-left, while the contract aligns queries to the end of the keys, so causal/window with
q_len != kv_len is refused, as are ALiBi and explicit positions. Never falls back silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfjax.nn import masks
from tfjax.nn.kernels import _common

_OTHERS = "'xla', 'chunked' or 'pallas'"


def cudnn_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal=False, q_segment_ids=None,
                    kv_segment_ids=None, window=None, alibi_slopes=None, bias=None, scale=None,
                    q_positions=None, kv_positions=None):
  """`tfjax.nn.ops.dot_product_attention` semantics on cuDNN, for the combinations it supports."""
  if alibi_slopes is not None:
    raise _common.unsupported("alibi_slopes", "cudnn", _OTHERS)
  if q_positions is not None or kv_positions is not None:
    raise _common.unsupported("explicit q_positions/kv_positions", "cudnn", "'xla' or 'chunked'")
  q_len, kv_len = q_BxTxHxE.shape[1], k_BxSxKxE.shape[1]
  causal = bool(causal or window is not None)
  if causal and q_len != kv_len:
    raise ValueError(
        f"implementation='cudnn' aligns causal/window masks to the top-left, but tfjax aligns "
        f"queries to the end of the keys; q_len {q_len} != kv_len {kv_len} needs {_OTHERS}")
  if q_BxTxHxE.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(
        f"implementation='cudnn' needs bfloat16/float16 inputs, got {q_BxTxHxE.dtype}")
  if jax.default_backend() != "gpu":
    raise ValueError(f"implementation='cudnn' needs an NVIDIA GPU; the JAX backend is "
                     f"{jax.default_backend()!r} (use {_OTHERS})")
  mask = None
  if q_segment_ids is not None or kv_segment_ids is not None:
    mask = masks.visibility_mask(q_len=q_len, kv_len=kv_len, causal=causal, window=window,
                               q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
  if bias is not None:
    bias = jnp.asarray(bias)
    bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)  # cuDNN wants a 4-D bias.
  out_BxTxHxE = jax.nn.dot_product_attention(
      q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, bias=bias, mask=mask, scale=scale, is_causal=causal,
      local_window_size=None if window is None else (window - 1, 0), implementation="cudnn")
  if mask is not None:
    # cuDNN averages the values of a row whose keys are all masked; the contract returns 0 there
    # (and multiplying by 0 also zeroes those rows' gradients).
    row_sees_a_key = mask.any(axis=-1)[:, 0, :, None, None]  # [B, T, 1, 1]
    out_BxTxHxE = jnp.where(row_sees_a_key, out_BxTxHxE, jnp.zeros((), out_BxTxHxE.dtype))
  return out_BxTxHxE
