"""The attention implementations experiments/bench_attention.py times, by name: ours through
`tfjax.nn.ops.dot_product_attention`, our kernels with a chosen forward or explicit tiles, and the
kernels bundled with JAX as peers (used only here; they have no ALiBi, the bundled TPU flash
attention no GQA).

  pallas          ours as `implementation='pallas'` runs them (on Hopper: the Mosaic GPU forward
                  where it applies, the Triton one elsewhere)
  pallas_triton   ours with the Triton forward
  pallas_mosaic   ours with the Mosaic GPU forward (inputs outside its scope raise)
  pallas_mosaic_bwd  the same with the Mosaic GPU backward too (opt-in, not yet timed)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tfjax.nn import ops
from tfjax.nn.kernels import flash_attention_mgpu, flash_attention_mgpu_bwd
from tfjax.nn.kernels.flash_attention import flash_attention
from tfjax.nn.kernels.flash_attention_tpu import TpuTilings, flash_attention_tpu


def bundled_pallas_mha(q, k, v, *, causal, alibi_slopes, kv_heads_differ):
  """JAX's own Pallas Triton mha (jax.experimental.pallas.ops.gpu), as a peer."""
  if alibi_slopes is not None or kv_heads_differ:
    raise NotImplementedError("bundled Pallas mha has no ALiBi / GQA")
  from jax.experimental.pallas.ops.gpu import attention  # pylint: disable=g-import-not-at-top
  return attention.mha(q, k, v, None, sm_scale=q.shape[-1] ** -0.5, causal=causal)


def bundled_tpu_flash(q, k, v, *, causal, alibi_slopes, kv_heads_differ):
  """JAX's own Pallas TPU flash attention (jax.experimental.pallas.ops.tpu), as a peer."""
  if alibi_slopes is not None or kv_heads_differ:
    raise NotImplementedError("bundled TPU flash attention has no ALiBi / GQA")
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash  # pylint: disable=g-import-not-at-top
  to_bhld = lambda x: jnp.swapaxes(x, 1, 2)
  out = tpu_flash.flash_attention(to_bhld(q), to_bhld(k), to_bhld(v), causal=causal,
                                  sm_scale=q.shape[-1] ** -0.5)
  return to_bhld(out)


def bundled_splash(q, k, v, *, causal, alibi_slopes, kv_heads_differ):
  """JAX's splash attention (jax.experimental.pallas.ops.tpu.splash_attention), as a peer. GQA:
  one MQA kernel per kv head, vmapped over kv heads and batch."""
  if alibi_slopes is not None:
    raise NotImplementedError("splash attention has no ALiBi")
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib  # pylint: disable=g-import-not-at-top
  batch, q_len, heads, head_dim = q.shape
  kv_len, kv_heads = k.shape[1], k.shape[2]
  groups = heads // kv_heads
  one = (mask_lib.CausalMask((q_len, kv_len), offset=kv_len - q_len) if causal
         else mask_lib.FullMask((q_len, kv_len)))
  make = splash.make_splash_mqa_single_device if kv_heads_differ else (
      splash.make_splash_mha_single_device)
  kernel = make(mask_lib.MultiHeadMask([one] * (groups if kv_heads_differ else heads)))
  q = q * head_dim ** -0.5  # splash does not scale the logits
  if kv_heads_differ:  # [B, K, G, T, D] queries against [B, K, S, D] keys
    q_ = q.reshape(batch, q_len, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    k_, v_ = (x.transpose(0, 2, 1, 3) for x in (k, v))
    out = jax.vmap(jax.vmap(kernel))(q_, k_, v_)  # [B, K, G, T, D]
    return out.transpose(0, 3, 1, 2, 4).reshape(q.shape)
  q_, k_, v_ = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
  return jax.vmap(kernel)(q_, k_, v_).transpose(0, 2, 1, 3)


BUNDLED_PEERS = {"mha_bundled": bundled_pallas_mha, "flash_tpu_bundled": bundled_tpu_flash,
                 "splash_bundled": bundled_splash}
DEFAULT_IMPLS = {"gpu": ["xla", "cudnn", "mha_bundled", "pallas"],
                 "tpu": ["xla", "flash_tpu_bundled", "splash_bundled", "pallas"]}


def mosaic_forward_pallas(q, k, v, *, causal, alibi_slopes, kv_heads_differ,
                          gpu_backward="triton", softcap=None):
  """Our Pallas kernels with the Mosaic GPU forward. Inputs it would hand to the Triton forward
  raise instead, so that every 'pallas_mosaic' row measures the Mosaic kernel. `gpu_backward`
  "mosaic" ('pallas_mosaic_bwd' rows) takes the Mosaic GPU backward too; calls outside its
  scope (ALiBi) raise too rather than timing Triton's backward under that label."""
  del kv_heads_differ  # GQA is in the Mosaic kernel's scope
  if jax.default_backend() != "gpu":
    raise NotImplementedError("the Mosaic GPU forward runs on NVIDIA Hopper GPUs only")
  if not flash_attention_mgpu.supports(q.shape, k.shape, q.dtype, causal=causal,
                                       has_segments=False, has_alibi=alibi_slopes is not None,
                                       window=None, softcap=softcap is not None):
    raise NotImplementedError("outside the Mosaic GPU forward's scope (bf16, head_dim 64/128, "
                              "block-multiple lengths)")
  if gpu_backward == "mosaic" and not flash_attention_mgpu_bwd.supports(
      q.shape, k.shape, q.dtype, causal=causal, has_segments=False,
      has_alibi=alibi_slopes is not None, window=None, softcap=softcap is not None):
    raise NotImplementedError("outside the Mosaic GPU backward's scope (no ALiBi)")
  return flash_attention(q, k, v, causal=causal, alibi_slopes=alibi_slopes, gpu_forward="mosaic",
                         gpu_backward=gpu_backward, softcap=softcap)


def _refuse(why, *args):
  del args
  raise NotImplementedError(why)


def attention_fn(impl, causal, alibi_slopes, kv_heads_differ, tilings=None, softcap=None):
  """`(q, k, v) -> out` of implementation `impl`; `softcap`: the scores' cap (None: off)."""
  if impl == "pallas_triton":
    return lambda q, k, v: flash_attention(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                           gpu_forward="triton", softcap=softcap)
  if impl == "pallas_mosaic":
    return lambda q, k, v: mosaic_forward_pallas(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                                 kv_heads_differ=kv_heads_differ, softcap=softcap)
  if impl == "pallas_mosaic_bwd":  # the Mosaic GPU forward and backward (both opt-in)
    return lambda q, k, v: mosaic_forward_pallas(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                                 kv_heads_differ=kv_heads_differ,
                                                 gpu_backward="mosaic", softcap=softcap)
  if impl in BUNDLED_PEERS:
    if softcap is not None:  # raised when traced, so the row records it as unsupported
      return functools.partial(_refuse, f"{impl} has no softcap")
    return lambda q, k, v: BUNDLED_PEERS[impl](q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                               kv_heads_differ=kv_heads_differ)
  if tilings is not None:  # our kernels with explicit tiles (--tune)
    kernel = flash_attention_tpu if isinstance(tilings, TpuTilings) else flash_attention
    return lambda q, k, v: kernel(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                  tilings=tilings, softcap=softcap)
  return lambda q, k, v: ops.dot_product_attention(q, k, v, causal=causal,
                                                   alibi_slopes=alibi_slopes, implementation=impl,
                                                   softcap=softcap)
