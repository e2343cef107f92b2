"""Decoding throughput with the KV cache vs recomputing the whole prefix every step.

  python experiments/bench_decode.py --out=bench_results/decode            # CPU-sized default
  python experiments/bench_decode.py --d_model=1024 --num_layers=12 ...    # bigger, on a GPU
  python experiments/bench_decode.py --smoke --out=/tmp/bench              # tiny, for tests

Both paths are greedy and compiled once per length:
  cached     tfjax.inference.decode.generate: one prefill, then one token per step reading the cache.
  recompute  no cache: each step runs the full forward pass over a fixed [batch, prompt + N]
             buffer (causality makes the unwritten tail irrelevant) and takes the argmax at the
             current position. Its per-step cost does not depend on the step, so only the first
             --recompute_steps steps are timed and the per-token cost is reported from them.
Random initialization: only speed is measured. Writes bench_decode.json and bench_decode.md.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.inference import decode
from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model
from tfjax.training.entry import cli


def parse_args(argv):
  parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="bench_results/decode", help="directory for json + md")
  parser.add_argument("--lengths", default="128,256,512,1024,2048", help="new tokens per run")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--vocab_size", type=int, default=512)
  parser.add_argument("--d_model", type=int, default=128)
  parser.add_argument("--num_layers", type=int, default=2)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--num_kv_heads", type=int, default=None)
  parser.add_argument("--d_ff", type=int, default=512)
  parser.add_argument("--position", default="rope")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--recompute_steps", type=int, default=16,
                      help="steps timed for the no-cache baseline (its step cost is constant)")
  parser.add_argument("--repeats", type=int, default=3, help="timed runs; the fastest counts")
  parser.add_argument("--smoke", action="store_true", help="tiny model and lengths (CPU tests)")
  args = parser.parse_args(argv)
  if args.smoke:
    args.lengths, args.vocab_size, args.d_model, args.num_layers = "8", 32, 32, 1
    args.d_ff, args.prompt_len, args.recompute_steps, args.repeats = 64, 4, 2, 1
  return args


def model_config(args) -> ModelConfig:
  longest = max(int(n) for n in args.lengths.split(","))
  return ModelConfig.from_config(dict(
      family="decoder", vocab_size=args.vocab_size, d_model=args.d_model,
      num_layers=args.num_layers, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
      d_ff=args.d_ff, position=args.position, max_len=args.prompt_len + longest,
      dtype=args.dtype))


def best_time(fn, repeats):
  jax.block_until_ready(fn())  # compile + warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def recompute_loop(cfg: ModelConfig, steps: int):
  """`steps` greedy tokens without a cache: a full forward pass over the whole buffer per token."""
  model = build_model(cfg)

  @jax.jit
  def run(params, buffer_BxL, start):
    def step(i, buffer_BxL):
      position = start + i
      logits_BxLxV = model.apply({"params": params}, buffer_BxL)
      token_B = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_BxLxV, position - 1, 1, False),
                           axis=-1).astype(jnp.int32)
      return jax.lax.dynamic_update_index_in_dim(buffer_BxL, token_B, position, 1)
    return jax.lax.fori_loop(0, steps, step, buffer_BxL)

  return run


def bench(args, argv):
  cfg = model_config(args)
  model = build_model(cfg)
  params = jax.jit(model.init)(jax.random.PRNGKey(0),
                               jnp.zeros((1, args.prompt_len), jnp.int32))["params"]
  prompts_BxP = np.random.default_rng(0).integers(
      1, cfg.vocab_size, (args.batch, args.prompt_len)).astype(np.int32)
  bytes_per_token = (2 * cfg.num_layers * cfg.attention.kv_heads * cfg.dim_per_head
                     * jnp.dtype(cfg.compute_dtype).itemsize)
  rows = []
  for new_tokens in (int(n) for n in args.lengths.split(",")):
    cached_s = best_time(lambda: decode.generate(  # pylint: disable=cell-var-from-loop
        cfg, params, prompts_BxP, max_new_tokens=new_tokens).tokens, args.repeats)
    steps = min(args.recompute_steps, new_tokens)
    buffer_BxL = np.zeros((args.batch, args.prompt_len + new_tokens), np.int32)
    buffer_BxL[:, :args.prompt_len] = prompts_BxP
    run = recompute_loop(cfg, steps)
    recompute_s = best_time(lambda: run(params, buffer_BxL, args.prompt_len), args.repeats)
    cached_ms = 1e3 * cached_s / new_tokens
    recompute_ms = 1e3 * recompute_s / steps
    rows.append(dict(
        new_tokens=new_tokens, cached_s=cached_s, cached_ms_per_token=cached_ms,
        cached_tokens_per_s=args.batch * new_tokens / cached_s,
        recompute_ms_per_token=recompute_ms,
        recompute_tokens_per_s=args.batch * 1e3 / recompute_ms,
        recompute_steps_timed=steps, speedup=recompute_ms / cached_ms,
        cache_mib=bytes_per_token * args.batch * (args.prompt_len + new_tokens) / 2**20))
    print(f"N={new_tokens:5d}  cached {cached_ms:8.3f} ms/token  "
          f"recompute {recompute_ms:8.3f} ms/token  x{recompute_ms / cached_ms:.1f}", flush=True)
  device = jax.devices()[0]
  command = " ".join(["python experiments/bench_decode.py"] + argv)
  return dict(
      date=datetime.date.today().isoformat(), command=command,
      jax_version=jax.__version__, backend=jax.default_backend(),
      device=f"{device.platform}: {device.device_kind}", host_cpus=os.cpu_count(),
      python=platform.python_version(), args=vars(args),
      params=int(sum(x.size for x in jax.tree.leaves(params))),
      cache_bytes_per_token=int(bytes_per_token), rows=rows)


def markdown(result) -> str:
  a = result["args"]
  lines = [
      f"### Decoding: KV cache vs full recompute ({result['device']}, jax {result['jax_version']},"
      f" {result['date']})",
      "",
      f"Command: `{result['command']}`  ",
      f"Decoder: d_model={a['d_model']}, layers={a['num_layers']}, heads={a['num_heads']}, "
      f"kv_heads={a['num_kv_heads'] or a['num_heads']}, d_ff={a['d_ff']}, vocab={a['vocab_size']}, "
      f"{a['position']}, {a['dtype']}, {result['params']:,} params; batch={a['batch']}, "
      f"prompt={a['prompt_len']} tokens, greedy.  ",
      f"Cache bytes per token = 2 * layers * kv_heads * head_dim * bytes = "
      f"{result['cache_bytes_per_token']:,} B.  ",
      f"Recompute = full forward over the [batch, prompt + N] buffer per token; "
      f"{a['recompute_steps']} steps timed (its step cost is constant in the step).",
      "",
      "| new tokens N | cached ms/token | cached tokens/s | recompute ms/token | "
      "recompute tokens/s | speedup | cache MiB |",
      "|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in result["rows"]:
    lines.append(
        f"| {r['new_tokens']} | {r['cached_ms_per_token']:.3f} | {r['cached_tokens_per_s']:.0f} | "
        f"{r['recompute_ms_per_token']:.3f} | {r['recompute_tokens_per_s']:.1f} | "
        f"{r['speedup']:.1f}x | {r['cache_mib']:.2f} |")
  return "\n".join(lines) + "\n"


@cli.guarded  # a bad flag or setting: one `error:` line, exit 2 (tfjax/training/entry/cli.py)
def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  result = bench(args, argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "bench_decode.json").write_text(json.dumps(result, indent=2))
  (out / "bench_decode.md").write_text(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
