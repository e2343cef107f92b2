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

from run_helpers import REPO, run_in_cpu_only_process

# The module (tfjax.nn.kernels re-exports its function under the same name).
tpu_kernels = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or jax.default_backend() != "cpu",
    reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")

GENERATION_TARGET = {"v4": "v4-8", "v5e": "v5e-1", "v5p": "v5p-8", "v6e": "v6e-1"}
# Masking features, cycled over the rows so that each appears on several generations and sizes.
FEATURES = [dict(causal=True), dict(window=700), dict(segments=True), dict(alibi=True),
            dict(gqa=True, causal=True), dict(ragged=True, causal=True),
            dict(dropout=True, causal=True)]


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
  seed = shape(dt=jnp.int32)  # the dropout seed, a traced scalar as in training

  def attention(q, k, v, q_ids, kv_ids, alibi, seed):
    return tpu_kernels.flash_attention_tpu(
        q, k, v, causal=features.get("causal", False), window=features.get("window"),
        q_segment_ids=q_ids if features.get("segments") else None,
        kv_segment_ids=kv_ids if features.get("segments") else None,
        alibi_slopes=alibi if features.get("alibi") else None, tilings=tilings, interpret=False,
        dropout_rate=0.1 if features.get("dropout") else 0.0, dropout_seed=seed,
        softcap=30.0 if features.get("softcap") else None)

  fn = attention
  if backward:
    fn = jax.grad(lambda *a: attention(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
  compiled = jax.jit(fn).trace(*args, *ids, slopes, seed).lower(
      lowering_platforms=("tpu",)).compile()
  return compiled.as_text()


@needs_libtpu
def test_a_tiling_compiles_forward_and_backward_for_v5e():
  """The default suite's one real compile: v5e bf16 head_dim 128, causal, small length."""
  text = compile_kernel("v5e", 128, jnp.bfloat16, dict(causal=True), 512, backward=True)
  assert text.count('custom_call_target="tpu_custom_call"') == 3  # forward, dK/dV, dQ


@needs_libtpu
def test_dropout_compiles_forward_and_backward_for_v5e():
  """The in-kernel dropout hash (int32 multiply, xor, logical shift; keys read from SMEM) lowers
  through Mosaic and libtpu, in the forward and both backward kernels."""
  text = compile_kernel("v5e", 128, jnp.bfloat16, dict(causal=True, dropout=True), 512,
                        backward=True)
  assert text.count('custom_call_target="tpu_custom_call"') == 3


@needs_libtpu
def test_softcap_compiles_forward_and_backward_for_v5e():
  """The in-kernel logit softcap (tanh on the scores, 1 - tanh^2 on dS) with causal ALiBi lowers
  through Mosaic and libtpu, in the forward and both backward kernels."""
  text = compile_kernel("v5e", 128, jnp.bfloat16, dict(causal=True, alibi=True, softcap=True),
                        512, backward=True)
  assert text.count('custom_call_target="tpu_custom_call"') == 3


@pytest.mark.skipif(jax.default_backend() == "tpu", reason="checks the host-without-TPU default")
def test_compiling_for_a_generation_picks_its_tilings_on_a_host_without_tpus():
  assert tpu_kernels.default_tilings(128, jnp.bfloat16) == tpu_kernels.TPU_TILINGS[
      ("v5e", 128, 2)]  # no TPU: the smallest VMEM's row
  with tpu_kernels.compiling_for("v6e"):
    assert tpu_kernels.default_tilings(128, jnp.bfloat16) == tpu_kernels.TPU_TILINGS[
        ("v6e", 128, 2)]
  assert tpu_kernels.tpu_generation() == "v5e"


ROWS = sorted(tpu_kernels.TPU_TILINGS)


@pytest.mark.slow
@needs_libtpu
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


# ---- Triton kernels for H100 (sm_90a), through the CUDA plugin ---------------------------------
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
H100_SHARED_BYTES = 232448  # shared_memory_per_block_optin of XLA's h100_sxm.txtpb: 227 KiB


def gpu_tiling_resources(head_dim_p: int, itemsize: int, length: int = 2048):
  """KernelResources of the forward, dK/dV and dQ kernels of one GPU_TILINGS row for H100."""
  from tfjax.aot import devices, gpu_kernels, targets  # pylint: disable=import-outside-toplevel
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  target = targets.parse_target("h100")
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(target)), ("x",)),
                       PartitionSpec())
  dtype = jnp.bfloat16 if itemsize == 2 else jnp.float32
  q = jax.ShapeDtypeStruct((1, length, 8, head_dim_p), dtype, sharding=spec)
  kv = jax.ShapeDtypeStruct((1, length, 2, head_dim_p), dtype, sharding=spec)
  loss = lambda q, k, v: gpu.flash_attention(
      q, k, v, causal=True, tilings=gpu.GPU_TILINGS[(head_dim_p, itemsize)],
      interpret=False).astype(jnp.float32).sum()
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
      lowering_platforms=("cuda",))
  _, resources = gpu_kernels.compile_with_resources(lowered, "tfjax_flash")
  return resources


# A register spill is a compile-time proxy for a slow kernel, and a GPU's timing outranks it: a
# tiling the committed device tuning timed fastest (docs/gpu/tuning_h200.json, jax 0.11.2, whose
# Triton path reports no spill counts) may spill up to this much under this host's compiler
# (jax 0.10.2's ptxas spills 204 B in the head_dim 128 bf16 dK/dV kernel of the 64 x 64, 4-warp
# backward that was 15% faster than the next candidate). Every other kernel must not spill.
TUNED_SPILL_BYTES = 1024


def tuned_on_a_gpu() -> set:
  """(padded head_dim, itemsize, 'forward' | 'backward', tiling) of the device tuning's winners."""
  import json, os  # pylint: disable=import-outside-toplevel,multiple-imports
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  with open(os.path.join(REPO, "docs", "gpu", "tuning_h200.json")) as f:
    best = json.load(f)["best"]
  tuned = set()
  for key, row in best.items():
    head_dim, dtype = key.split(",")
    for which in ("forward", "backward"):
      tuned.add((int(head_dim), jnp.dtype(dtype).itemsize, which,
                 gpu.KernelTiling(**row[which])))
  return tuned


def check_every_gpu_tiling():
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  tuned = tuned_on_a_gpu()
  for head_dim_p, itemsize in sorted(gpu.GPU_TILINGS):
    resources = gpu_tiling_resources(head_dim_p, itemsize)
    assert sorted(r.name for r in resources) == ["tfjax_flash_dkdv", "tfjax_flash_dq",
                                                 "tfjax_flash_forward"], resources
    for r in resources:
      which = "forward" if r.name == "tfjax_flash_forward" else "backward"
      tiling = getattr(gpu.GPU_TILINGS[(head_dim_p, itemsize)], which)
      allowed = TUNED_SPILL_BYTES if (head_dim_p, itemsize, which, tiling) in tuned else 0
      assert r.spill_bytes <= allowed and 0 < r.registers <= 255, (head_dim_p, itemsize, r)
      assert 0 < r.shared_bytes <= H100_SHARED_BYTES, (head_dim_p, itemsize, r)


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_every_gpu_tiling_compiles_for_h100_without_spills():
  run_in_cpu_only_process(__file__, "check_every_gpu_tiling", timeout=1200)


def check_tuning_candidates_are_pruned():
  """bench_attention --tune drops a tiling whose shared memory cannot fit an H100 block, and
  keeps one that fits without spills."""
  import runpy, os  # pylint: disable=import-outside-toplevel,multiple-imports
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  bench = runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__)))), "experiments", "bench_attention.py"), run_name="bench_attention")
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(targets.parse_target("h100"))),
                            ("x",)), PartitionSpec())
  check = lambda t: bench["compiles_cleanly"](t, 128, jnp.bfloat16, 1024, sharding=spec)
  assert not check(gpu.KernelTiling(256, 256, 8, 4))  # ~576 KiB of shared memory
  assert check(gpu.KernelTiling(64, 64, 8, 2))  # head_dim 128's backward before the GPU tuning
  forward = gpu.GPU_TILINGS[(128, 2)].forward  # its backward would need too much shared memory
  assert bench["compiles_cleanly"](forward, 128, jnp.bfloat16, 1024, sharding=spec,
                                   backward=False)


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_bench_attention_prunes_tilings_that_do_not_fit_an_h100():
  run_in_cpu_only_process(__file__, "check_tuning_candidates_are_pruned", timeout=1200)


def test_the_docs_gpu_kernel_table_shows_the_current_tilings():
  """docs/benchmarks/kernels.md's H100 kernel table (experiments/aot_kernel_table.py) lists every
  GPU_TILINGS row with the tiling the code uses, so a retuned table cannot leave it stale."""
  import os, re  # pylint: disable=import-outside-toplevel,multiple-imports
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  with open(os.path.join(REPO, "docs", "benchmarks", "kernels.md")) as f:
    table = f.read().split("<!-- aot-kernel-table:start -->")[1].split("TPU, Mosaic kernels")[0]
  rows = re.findall(r"^\| (\d+) \| (bfloat16|float32) \| (forward|dkdv|dq) \| (\d+)x(\d+) w(\d+) "
                    r"s(\d+) \|", table, re.M)
  shown = {(int(d), 2 if dtype == "bfloat16" else 4, kernel): gpu.KernelTiling(*map(int, t))
           for d, dtype, kernel, *t in rows}
  expected = {}
  for (head_dim, itemsize), tilings in gpu.GPU_TILINGS.items():
    expected[head_dim, itemsize, "forward"] = tilings.forward
    expected[head_dim, itemsize, "dkdv"] = expected[head_dim, itemsize, "dq"] = tilings.backward
  assert shown == expected
