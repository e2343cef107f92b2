"""The Mosaic TPU flash-attention kernels compiled for real (no interpret mode) by libtpu for each
TPU generation, from this CPU host: every TPU_TILINGS row, forward and forward + backward. A tile
that overflows the generation's scoped VMEM fails this compile as it would on the chip."""

import importlib
import importlib.util
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# The module (tfjax.nn.kernels re-exports its function under the same name).
tpu_kernels = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or jax.default_backend() != "cpu",
    reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")

GENERATION_TARGET = {"v4": "v4-8", "v5e": "v5e-1", "v5p": "v5p-8", "v6e": "v6e-1"}
# Masking features, cycled over the rows so that each appears on several generations and sizes.
FEATURES = [dict(causal=True), dict(window=700), dict(segments=True), dict(alibi=True),
            dict(gqa=True, causal=True), dict(ragged=True, causal=True)]


def _device(generation):
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  return devices.compile_only_devices(targets.parse_target(GENERATION_TARGET[generation]))[0]


def compile_kernel(generation, head_dim, dtype, features, length, backward):
  """Compiles flash_attention_tpu with this generation's TPU_TILINGS row; returns the HLO text."""
  itemsize = 2 if dtype == jnp.bfloat16 else 4
  tilings = tpu_kernels.TPU_TILINGS[(generation, tpu_kernels.padded_head_dim(head_dim), itemsize)]
  heads, kv_heads = (8, 2) if features.get("gqa") else (4, 4)
  q_len = length - 37 if features.get("ragged") else length
  spec = NamedSharding(Mesh(np.array([_device(generation)]), ("x",)), PartitionSpec())
  shape = lambda *s, dt=dtype: jax.ShapeDtypeStruct(s, dt, sharding=spec)
  args = [shape(1, q_len, heads, head_dim), shape(1, length, kv_heads, head_dim),
          shape(1, length, kv_heads, head_dim)]
  ids = [shape(1, q_len, dt=jnp.int32), shape(1, length, dt=jnp.int32)]
  slopes = shape(heads, dt=jnp.float32)

  def attention(q, k, v, q_ids, kv_ids, alibi):
    return tpu_kernels.flash_attention_tpu(
        q, k, v, causal=features.get("causal", False), window=features.get("window"),
        q_segment_ids=q_ids if features.get("segments") else None,
        kv_segment_ids=kv_ids if features.get("segments") else None,
        alibi_slopes=alibi if features.get("alibi") else None, tilings=tilings, interpret=False)

  fn = attention
  if backward:
    fn = jax.grad(lambda *a: attention(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
  compiled = jax.jit(fn).trace(*args, *ids, slopes).lower(lowering_platforms=("tpu",)).compile()
  return compiled.as_text()


def test_a_tiling_compiles_forward_and_backward_for_v5e():
  """The default suite's one real compile: v5e bf16 head_dim 128, causal, small length."""
  text = compile_kernel("v5e", 128, jnp.bfloat16, dict(causal=True), 512, backward=True)
  assert text.count('custom_call_target="tpu_custom_call"') == 3  # forward, dK/dV, dQ


ROWS = sorted(tpu_kernels.TPU_TILINGS)


@pytest.mark.slow
@pytest.mark.parametrize("row, features", list(zip(ROWS, itertools.cycle(FEATURES))) + [
    (row, dict(causal=True)) for row in ROWS if row[0] == "v6e"])
@pytest.mark.parametrize("backward", [False, True])
def test_every_tiling_compiles_on_its_generation(row, features, backward):
  generation, head_dim_p, itemsize = row
  dtype = jnp.bfloat16 if itemsize == 2 else jnp.float32
  # head_dim 64 pads to the 128 row; 128 and 256 are their own rows.
  for head_dim in ((64, 128) if head_dim_p == 128 else (256,)):
    text = compile_kernel(generation, head_dim, dtype, features, 4096, backward)
    assert text.count('custom_call_target="tpu_custom_call"') == (3 if backward else 1)
