"""Peak host memory and wall time of `python -m tfjax.hf import` on a 1B-class checkpoint.

  python experiments/bench_hf_import.py [--shape=llama3.2-1b] [--source_dtype=bfloat16]
      [--dtype=bfloat16] [--layers=N] [--out=bench_results] [--scratch=DIR]

Writes a synthetic Hugging Face LLaMA directory at the shapes of a released config (random
N(0, 0.02) weights in --source_dtype, 2 GB safetensors shards with an index, the released
config.json), then imports it in a fresh process and reads that process's peak resident set
(ru_maxrss from wait4: anonymous and file-backed pages together). The same import of a tiny
model gives the constant (Python, JAX, orbax), so the result is stated both as peak / size and
as (peak - constant) / size, size = the parameters in the target --dtype. Writes
OUT/bench_hf_import.json and .md stamped with the machine, JAX version and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfjax.hf import shards  # noqa: E402  pylint: disable=wrong-import-position

# Released config.json sizes (architecture fields only; the bench writes the rest).
SHAPES = {
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, tie_word_embeddings=True, rms_norm_eps=1e-5,
                        max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0,
                                      "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 8192,
                                      "rope_type": "llama3"}),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=128,
                 rope_theta=10000.0),
}


def tensor_shapes(c: dict) -> dict:
  """{HF tensor name: shape} of a LlamaForCausalLM with config fields `c`."""
  d, f, e = c["hidden_size"], c["intermediate_size"], c["head_dim"]
  q, kv = c["num_attention_heads"] * e, c["num_key_value_heads"] * e
  out = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    out.update({p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,)})
  return out


def write_checkpoint(directory: str, config: dict, dtype: str) -> int:
  """A random LLaMA checkpoint in `directory`, one 2 GB shard in memory at a time; returns the
  parameter count."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  store = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
  shapes = tensor_shapes(config)
  sizes = {n: int(np.prod(s)) * store.itemsize for n, s in shapes.items()}
  groups = shards.plan(sizes, 2 * 10 ** 9)
  rng = np.random.default_rng(0)
  weight_map = {}
  for k, names in enumerate(groups):
    name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {n: (rng.standard_normal(shapes[n], dtype=np.float32) * 0.02).astype(store)
               for n in names}
    save_file(tensors, os.path.join(directory, name), metadata={"format": "pt"})
    weight_map.update({n: name for n in names})
    del tensors
  with open(os.path.join(directory, shards.INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f)
  with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
    json.dump(dict(config, model_type="llama", architectures=["LlamaForCausalLM"],
                   hidden_act="silu", torch_dtype=dtype), f)
  return sum(int(np.prod(s)) for s in shapes.values())


def measure_import(hf_dir: str, workdir: str, dtype: str) -> tuple:
  """(peak RSS bytes, wall seconds) of the import CLI in a fresh process."""
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  start = time.time()
  proc = subprocess.Popen([sys.executable, "-m", "tfjax.hf", "import", f"--hf_dir={hf_dir}",
                           f"--workdir={workdir}", f"--dtype={dtype}"], env=env)
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.time() - start
  if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit(f"error: the import of {hf_dir} failed (exit {status})")
  return usage.ru_maxrss * 1024, wall


def run_one(shape: str, source_dtype: str, dtype: str, layers, scratch: str) -> dict:
  config = dict(SHAPES[shape])
  if layers:
    config["num_hidden_layers"] = layers
  hf_dir, workdir = os.path.join(scratch, f"hf_{shape}"), os.path.join(scratch, f"run_{shape}")
  shutil.rmtree(hf_dir, ignore_errors=True)
  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(hf_dir)
  params = write_checkpoint(hf_dir, config, source_dtype)
  peak, wall = measure_import(hf_dir, workdir, dtype)
  shutil.rmtree(hf_dir, ignore_errors=True)
  shutil.rmtree(workdir, ignore_errors=True)
  return dict(shape=shape, layers=config["num_hidden_layers"], params=params,
              source_dtype=source_dtype, dtype=dtype,
              size_bytes=params * (2 if dtype == "bfloat16" else 4), peak_rss_bytes=peak,
              wall_s=round(wall, 1))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
  parser.add_argument("--source_dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
  parser.add_argument("--out", default="bench_results")
  parser.add_argument("--scratch", default=None, help="where the checkpoint and run are "
                      "written (and removed); default a temporary directory")
  args = parser.parse_args(argv)
  if args.layers is not None and args.layers < 1:
    parser.error(f"--layers={args.layers} must be at least 1")
  scratch = args.scratch or tempfile.mkdtemp(prefix="bench_hf_import_")
  os.makedirs(scratch, exist_ok=True)
  baseline = run_one("tiny", args.source_dtype, args.dtype, None, scratch)
  result = run_one(args.shape, args.source_dtype, args.dtype, args.layers, scratch)
  import jax  # pylint: disable=import-outside-toplevel
  size, peak, base = result["size_bytes"], result["peak_rss_bytes"], baseline["peak_rss_bytes"]
  result.update(constant_rss_bytes=base, peak_over_size=round(peak / size, 3),
                above_constant_over_size=round((peak - base) / size, 3),
                machine=f"{platform.node()} {os.cpu_count()} CPUs", jax=jax.__version__,
                date=datetime.date.today().isoformat(),
                command="python experiments/bench_hf_import.py " + " ".join(
                    sys.argv[1:] if argv is None else argv))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_hf_import.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  gb = 1e9
  row = (f"| `{result['command']}` | {result['machine']} | {result['jax']} | {result['date']} | "
         f"{result['shape']} ({result['layers']} layers), {result['params']:,} params, "
         f"{result['source_dtype']} -> {result['dtype']} | {size / gb:.2f} GB | "
         f"{peak / gb:.2f} GB ({result['peak_over_size']}x) | {base / gb:.2f} GB | "
         f"{result['above_constant_over_size']}x | {result['wall_s']} s |")
  header = ("| command | machine | JAX | date | model | size in --dtype | peak RSS | constant "
            "(tiny import) | (peak - constant) / size | wall |\n|" + " --- |" * 10)
  with open(os.path.join(args.out, "bench_hf_import.md"), "w", encoding="utf-8") as f:
    f.write(header + "\n" + row + "\n")
  print(json.dumps(result, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
