"""Attention benchmark: time, throughput and memory of every implementation, forward and fwd+bwd.

Default sweep: bf16, d_model 2048 (heads = 2048 / head_dim), batch x L = 16k tokens, L in
{512 .. 16k}, head_dim in {64, 128}, causal and not. Implementations by backend:
  GPU  (and elsewhere) xla, cudnn, the Pallas Triton mha bundled with JAX ('mha_bundled', a peer) and ours
       ('pallas' as the library runs it); selectable, not default: 'pallas_triton' and
       'pallas_mosaic', ours with the Triton or the Mosaic GPU forward (experiments/attention_impls.py);
       'pallas_mosaic_bwd', the Mosaic GPU forward and backward (opt-in, not yet timed);
  TPU  xla, JAX's bundled TPU flash attention ('flash_tpu_bundled') and splash attention
       ('splash_bundled') as peers, and ours ('pallas' = the Mosaic kernels).
The bundled kernels are peers used only here (they have no ALiBi; the bundled TPU flash attention
no GQA). Variants 'alibi', 'gqa' and 'softcap' (causal, with ALiBi / with kv_heads = heads / 4 /
with Gemma 2's attention softcap of 50) test that they cost within 10% of causal.

FLOPs counted (the FlashAttention convention): forward 4 * B * L^2 * H * D, halved when causal;
backward 2.5x forward. Memory: the compiled executable's temporaries + arguments + outputs
(XLA memory analysis) and, where the device reports it, the process's peak bytes in use.

  python experiments/bench_attention.py --out bench_results/h100
  python experiments/bench_attention.py --out bench_results/tpu_v5e       # on a TPU host
  python experiments/bench_attention.py --lengths 4096 --head_dims 128 --impls pallas --tune
  python experiments/bench_attention.py --impls pallas,pallas_mosaic,cudnn --phases fwd
  python experiments/bench_attention.py --smoke --out /tmp/bench   # tiny CPU run (tests)
Writes results.json, results.md and results.png (plus tuning.json with --tune) under --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from tfjax.nn.kernels import flash_attention
from tfjax.nn.kernels.flash_attention import KernelTiling, Tilings
from tfjax.nn.kernels.flash_attention_tpu import TpuTiling, TpuTilings
from tfjax.training.entry import cli

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from attention_impls import (BUNDLED_PEERS, DEFAULT_IMPLS, attention_fn,  # noqa: F401
                             bundled_pallas_mha, bundled_splash, bundled_tpu_flash,
                             mosaic_forward_pallas)

SOFTCAP = 50.0  # the 'softcap' variant's cap: Gemma 2's attention logits softcap
VARIANT_TOLERANCE = 1.10  # alibi / gqa may cost at most 10% more than plain causal.


def time_ms(compiled, args, iters, min_seconds):
  """Median milliseconds per call. Calls are issued back to back in rounds of `reps` between two
  synchronisations (reps sized from a first timed call so that a round lasts >= ~20 ms), so the
  host's dispatch and sync overhead (tens of microseconds) stays out of sub-millisecond kernels."""
  jax.block_until_ready(compiled(*args))  # warm up
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  reps = max(1, min(100, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
  times = []
  start = time.perf_counter()
  while len(times) < iters or (time.perf_counter() - start < min_seconds and len(times) < 100):
    t0 = time.perf_counter()
    for _ in range(reps):
      out = compiled(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) * 1e3 / reps)
  return statistics.median(times)


def memory_mib(compiled):
  """Compiled footprint (temporaries + arguments + outputs) in MiB, or None if not reported."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  total = (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
           + analysis.output_size_in_bytes)
  return total / 2 ** 20


def device_peak_mib():
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 2 ** 20


@dataclasses.dataclass
class Case:
  """One benchmark point: its row's keys, abstract inputs, and the functions per phase."""
  row: dict
  shapes: dict  # name -> jax.ShapeDtypeStruct
  phases: dict  # phase -> (fn, argument names, FLOPs)
  compiled: dict = dataclasses.field(default_factory=dict)  # phase -> Compiled or Exception


def make_case(impl, variant, seq_len, head_dim, causal, cfg, tilings=None,
              phases=("fwd", "fwd_bwd")) -> Case:
  batch = max(1, cfg.tokens // seq_len)
  heads = cfg.d_model // head_dim
  kv_heads = max(1, heads // 4) if variant == "gqa" else heads
  dtype = jnp.dtype(cfg.dtype)
  slopes = 2.0 ** (-8.0 * jnp.arange(1, heads + 1) / heads) if variant == "alibi" else None
  attn = attention_fn(impl, causal, slopes, kv_heads != heads, tilings,
                      softcap=SOFTCAP if variant == "softcap" else None)

  def fwd_bwd(q, k, v, d_out):
    _, vjp = jax.vjp(attn, q, k, v)
    return vjp(d_out)

  fwd_flops = 4 * batch * seq_len ** 2 * heads * head_dim * (0.5 if causal else 1.0)
  spec = lambda h: jax.ShapeDtypeStruct((batch, seq_len, h, head_dim), dtype)
  shapes = dict(q=spec(heads), k=spec(kv_heads), v=spec(kv_heads), d_out=spec(heads))
  every = dict(fwd=(attn, ("q", "k", "v"), fwd_flops),
               fwd_bwd=(fwd_bwd, ("q", "k", "v", "d_out"), 3.5 * fwd_flops))
  row = dict(impl=impl, variant=variant, seq_len=seq_len, head_dim=head_dim, causal=causal,
             batch=batch, heads=heads, kv_heads=kv_heads, dtype=dtype.name)
  if tilings is not None:
    row["tilings"] = dataclasses.asdict(tilings)
  return Case(row, shapes, {name: every[name] for name in phases})


def compile_case(case: Case) -> Case:
  """Compiles every phase from abstract inputs (no device memory): safe to run in threads."""
  for name, (fn, arg_names, _) in case.phases.items():
    try:
      case.compiled[name] = jax.jit(fn).lower(*(case.shapes[a] for a in arg_names)).compile()
    except Exception as e:  # pylint: disable=broad-except  # recorded: unsupported, smem, ...
      case.compiled[name] = e
  return case


def _status(e: Exception) -> str:
  return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def time_case(case: Case, cfg) -> dict:
  """Times the compiled phases on fresh random inputs; errors (OOM, unsupported) are recorded."""
  row = dict(case.row)
  keys = jax.random.split(jax.random.PRNGKey(0), len(case.shapes))
  arrays = {name: jax.random.normal(key, s.shape, s.dtype)
            for key, (name, s) in zip(keys, case.shapes.items())}
  try:
    for name, (_, arg_names, flops) in case.phases.items():
      compiled = case.compiled[name]
      if isinstance(compiled, Exception):
        raise compiled
      ms = time_ms(compiled, [arrays[a] for a in arg_names], cfg.iters, cfg.min_seconds)
      row[f"{name}_ms"] = ms
      row[f"{name}_tflops"] = flops / (ms * 1e-3) / 1e12
      row[f"{name}_mem_mib"] = memory_mib(compiled)
    row["device_peak_mib"] = device_peak_mib()
    row["status"] = "ok"
  except Exception as e:  # pylint: disable=broad-except  # recorded, e.g. OOM or unsupported
    row["status"] = _status(e)
  del arrays
  case.compiled.clear()  # free the executable
  print(json.dumps(row), flush=True)
  return row


def run_cases(cases, cfg, on_row=None):
  """Compiles the cases in chunks, each in a thread pool (compilation is CPU-bound and mostly
  outside the GIL), and times a chunk's cases one at a time once it has compiled, with nothing
  compiling meanwhile (a tracing thread holding the GIL would delay the timed dispatches)."""
  rows, workers = [], max(1, cfg.compile_workers)
  chunk = 2 * workers
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    for first in range(0, len(cases), chunk):
      start = time.perf_counter()
      compiled = list(pool.map(compile_case, cases[first:first + chunk]))
      print(f"compiled cases {first}-{first + len(compiled) - 1} of {len(cases)} in "
            f"{time.perf_counter() - start:.1f} s", flush=True)
      for case in compiled:
        rows.append(time_case(case, cfg))
        if on_row is not None:
          on_row(rows)
  return rows


def variant_checks(rows):
  """For each (impl, L, D): cost of the alibi / gqa variants relative to plain causal."""
  base = {(r["impl"], r["seq_len"], r["head_dim"]): r for r in rows
          if r["variant"] == "base" and r["causal"] and r["status"] == "ok"}
  checks = []
  for r in rows:
    key = (r["impl"], r["seq_len"], r["head_dim"])
    if r["variant"] == "base" or r["status"] != "ok" or key not in base:
      continue
    for metric in ("fwd_ms", "fwd_bwd_ms"):
      if metric not in r or metric not in base[key]:  # a phase --phases left out
        continue
      ratio = r[metric] / base[key][metric]
      checks.append(dict(impl=r["impl"], variant=r["variant"], seq_len=r["seq_len"],
                         head_dim=r["head_dim"], metric=metric, ratio_to_causal=ratio,
                         within_10pct=ratio <= VARIANT_TOLERANCE))
  return checks


def fmt(x, spec):
  return "-" if x is None else format(x, spec)


def write_markdown(path, meta, rows, checks):
  lines = [f"# Attention benchmark ({meta['device']}, JAX {meta['jax']}, {meta['date']})", "",
           f"dtype {meta['dtype']}, d_model {meta['d_model']}, batch x L = {meta['tokens']} "
           "tokens. FLOPs: fwd 4BL^2HD (x0.5 causal), bwd 2.5x fwd. Memory: compiled "
           "temporaries + arguments + outputs.", "",
           "| impl | variant | L | D | causal | B | H/KV | fwd ms | fwd TFLOP/s | fwd+bwd ms "
           "| fwd+bwd TFLOP/s | fwd MiB | fwd+bwd MiB | status |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['impl']} | {r['variant']} | {r['seq_len']} | {r['head_dim']} | {r['causal']} "
        f"| {r['batch']} | {r['heads']}/{r['kv_heads']} | {fmt(r.get('fwd_ms'), '.3f')} "
        f"| {fmt(r.get('fwd_tflops'), '.3g')} | {fmt(r.get('fwd_bwd_ms'), '.3f')} "
        f"| {fmt(r.get('fwd_bwd_tflops'), '.3g')} | {fmt(r.get('fwd_mem_mib'), '.1f')} "
        f"| {fmt(r.get('fwd_bwd_mem_mib'), '.1f')} | {r['status']} |")
  if checks:
    lines += ["", f"## Variant cost relative to causal (pass: ratio <= {VARIANT_TOLERANCE})", "",
              "| impl | variant | L | D | metric | ratio | within 10% |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['impl']} | {c['variant']} | {c['seq_len']} | {c['head_dim']} | {c['metric']} "
              f"| {c['ratio_to_causal']:.3f} | {'yes' if c['within_10pct'] else 'NO'} |"
              for c in checks]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plot(path, meta, rows):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.8),
                           squeeze=False)
  for ax, (head_dim, causal) in zip(axes[0], panels):
    for impl in sorted({r["impl"] for r in rows}):
      points = sorted((r["seq_len"], r["fwd_bwd_tflops"]) for r in rows
                      if r["impl"] == impl and r["variant"] == "base" and "fwd_bwd_tflops" in r
                      and r["head_dim"] == head_dim and r["causal"] == causal)
      if points:
        ax.plot(*zip(*points), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_title(f"D={head_dim}, {'causal' if causal else 'full'}")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("fwd+bwd TFLOP/s")
    ax.legend(fontsize=8)
  fig.suptitle(f"{meta['device']} | JAX {meta['jax']} | {meta['dtype']} | {meta['date']}",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


TUNE_CANDIDATES = [KernelTiling(bq, bk, w, s) for bq, bk in ((128, 64), (128, 128), (64, 64),
                                                             (64, 128), (128, 32), (32, 64))
                   for w in (4, 8) for s in (2, 3)]


# TPU: (8, 128)-aligned tiles around the TPU_TILINGS rows (flash_attention_tpu.py).
TPU_TUNE_CANDIDATES = [TpuTiling(bq, bk) for bq in (128, 256, 512, 1024)
                       for bk in (128, 256, 512, 1024, 2048)]


# Shared memory per block of an H100 (XLA's h100_sxm.txtpb, shared_memory_per_block_optin).
GPU_SHARED_BYTES = 232448


def compiles_cleanly(tiling: KernelTiling, head_dim: int, dtype, seq_len: int,
                     sharding=None, backward: bool = True) -> bool:
  """Whether the forward (+ backward) kernels with `tiling` compile for this GPU with no register
  spills and within its shared memory (tfjax/aot/gpu_kernels.py; the same check as the aot_gpu
  tests). Kernels whose PTX XLA does not dump (jax >= 0.11 compiles Pallas Triton kernels itself)
  are judged by compiling only. `sharding` (on compile-only H100 devices, tfjax.aot) checks it
  from a host without the GPU."""
  from tfjax.aot import gpu_kernels  # pylint: disable=g-import-not-at-top
  q = jax.ShapeDtypeStruct((1, seq_len, 8, head_dim), dtype, sharding=sharding)
  kv = jax.ShapeDtypeStruct((1, seq_len, 2, head_dim), dtype, sharding=sharding)
  loss = lambda q, k, v: flash_attention(q, k, v, causal=True, tilings=Tilings(tiling, tiling),
                                         interpret=False).astype(jnp.float32).sum()
  program = jax.grad(loss, argnums=(0, 1, 2)) if backward else loss
  try:
    lowered = jax.jit(program).trace(q, kv, kv).lower(lowering_platforms=("cuda",))
    _, resources = gpu_kernels.compile_with_resources(lowered, "tfjax_flash")
  except Exception:  # pylint: disable=broad-except  (e.g. "Shared memory size limit exceeded")
    return False
  return all(r.spill_bytes == 0 and r.shared_bytes <= GPU_SHARED_BYTES for r in resources)


def tune(cfg, out_dir, meta):
  """Times our kernels over candidate tilings at the longest length, causal: every forward
  candidate first, then every backward candidate with the best forward, for each head_dim.
  On GPU, candidates that spill registers or overflow shared memory (`compiles_cleanly`) are
  dropped before timing; any that still fail to compile drop out. Writes every timing and the
  winners (for GPU_TILINGS on GPU, TPU_TILINGS on TPU) to tuning.json."""
  on_tpu = jax.default_backend() == "tpu"
  pair = TpuTilings if on_tpu else Tilings
  seq_len = cfg.lengths[-1]

  def clean(head_dim, backward):
    if on_tpu:
      return TPU_TUNE_CANDIDATES
    return [t for t in TUNE_CANDIDATES
            if compiles_cleanly(t, head_dim, jnp.dtype(cfg.dtype), seq_len, backward=backward)]

  fastest = lambda rows, metric: min((r for r in rows if r["status"] == "ok"),
                                     key=lambda r: r[metric], default=None)
  forward_rows = run_cases([make_case("pallas", "base", seq_len, head_dim, True, cfg,
                                      pair(fwd, fwd), ["fwd"])
                            for head_dim in cfg.head_dims for fwd in clean(head_dim, False)],
                           cfg)
  best_forward = {}
  for head_dim in cfg.head_dims:
    best = fastest([r for r in forward_rows if r["head_dim"] == head_dim], "fwd_ms")
    if best is not None:
      best_forward[head_dim] = (TpuTiling if on_tpu else KernelTiling)(
          **best["tilings"]["forward"])
  backward_rows = run_cases([make_case("pallas", "base", seq_len, head_dim, True, cfg,
                                       pair(fwd, bwd))
                             for head_dim, fwd in best_forward.items()
                             for bwd in clean(head_dim, True)], cfg)
  best = {}
  for head_dim, fwd in best_forward.items():
    winner = fastest([r for r in backward_rows if r["head_dim"] == head_dim], "fwd_bwd_ms")
    if winner is not None:
      best[f"{head_dim},{cfg.dtype}"] = dict(
          forward=dataclasses.asdict(fwd), backward=winner["tilings"]["backward"],
          seq_len=seq_len, fwd_ms=fastest([r for r in forward_rows if r["head_dim"] == head_dim],
                                          "fwd_ms")["fwd_ms"], fwd_bwd_ms=winner["fwd_bwd_ms"])
  with open(os.path.join(out_dir, "tuning.json"), "w") as f:
    json.dump(dict(meta=meta, best=best, forward=forward_rows, backward=backward_rows), f,
              indent=1)
  print(json.dumps(best, indent=1))


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ints = lambda s: [int(x) for x in s.split(",")]
  strs = lambda s: s.split(",")
  p.add_argument("--lengths", type=ints, default=[512, 1024, 2048, 4096, 8192, 16384])
  p.add_argument("--head_dims", type=ints, default=[64, 128])
  p.add_argument("--impls", type=strs, default=None,
                 help="default by backend: " + "; ".join(
                     f"{b}: {','.join(i)}" for b, i in DEFAULT_IMPLS.items()))
  p.add_argument("--variants", type=strs, default=["alibi", "gqa", "softcap"],
                 help="extra causal variants, besides base")
  p.add_argument("--variant_impls", type=strs, default=None,
                 help="implementations the variants run for (default: all of --impls)")
  p.add_argument("--compile_workers", type=int, default=min(8, os.cpu_count() or 1),
                 help="threads compiling cases before any is timed")
  p.add_argument("--causal", type=strs, default=["false", "true"])
  p.add_argument("--phases", type=strs, default=["fwd", "fwd_bwd"],
                 help="what is timed: fwd (forward only) and/or fwd_bwd")
  p.add_argument("--tokens", type=int, default=16384, help="batch x L")
  p.add_argument("--d_model", type=int, default=2048)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--iters", type=int, default=10)
  p.add_argument("--min_seconds", type=float, default=1.0)
  p.add_argument("--out", default="bench_results")
  p.add_argument("--tune", action="store_true", help="sweep our tilings instead")
  p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks the script works")
  cfg = p.parse_args(argv)
  if cfg.smoke:
    cfg.lengths, cfg.head_dims, cfg.impls = [64], [32], ["xla", "chunked", "pallas"]
    cfg.causal, cfg.variants = ["true"], ["gqa"]
    cfg.tokens, cfg.d_model, cfg.dtype, cfg.iters, cfg.min_seconds = 64, 128, "float32", 1, 0.0
  if cfg.impls is None:
    cfg.impls = DEFAULT_IMPLS["tpu" if jax.default_backend() == "tpu" else "gpu"]
  if not cfg.phases or set(cfg.phases) - {"fwd", "fwd_bwd"}:
    p.error(f"--phases={','.join(cfg.phases)}: use fwd, fwd_bwd or fwd,fwd_bwd")
  return cfg


@cli.guarded  # a bad flag or setting: one `error:` line, exit 2 (tfjax/training/entry/cli.py)
def main(argv=None):
  cfg = parse_args(argv)
  os.makedirs(cfg.out, exist_ok=True)
  device = jax.devices()[0]
  meta = dict(device=f"{device.platform}:{device.device_kind}", jax=jax.__version__,
              date=datetime.datetime.now().isoformat(timespec="seconds"), dtype=cfg.dtype,
              d_model=cfg.d_model, tokens=cfg.tokens, smoke=cfg.smoke)
  if cfg.tune:
    return tune(cfg, cfg.out, meta)
  cases = []
  for head_dim in cfg.head_dims:
    for seq_len in cfg.lengths:
      for impl in cfg.impls:
        for causal in cfg.causal:
          cases.append(make_case(impl, "base", seq_len, head_dim, causal == "true", cfg,
                                 phases=cfg.phases))
        if cfg.variant_impls is None or impl in cfg.variant_impls:
          cases += [make_case(impl, variant, seq_len, head_dim, True, cfg, phases=cfg.phases)
                    for variant in cfg.variants]

  def save_partial(rows):  # so that a run stopped midway keeps what it measured
    with open(os.path.join(cfg.out, "results.json"), "w") as f:
      json.dump(dict(meta=meta, rows=rows, partial=True), f, indent=1)

  rows = run_cases(cases, cfg, save_partial)
  checks = variant_checks(rows)
  with open(os.path.join(cfg.out, "results.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows, variant_checks=checks), f, indent=1)
  write_markdown(os.path.join(cfg.out, "results.md"), meta, rows, checks)
  write_plot(os.path.join(cfg.out, "results.png"), meta, rows)
  print(f"wrote {cfg.out}/results.{{json,md,png}}")


if __name__ == "__main__":
  main()
