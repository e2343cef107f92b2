"""The tables of docs/benchmarks/gpu.md, generated from the committed results.

  python scripts/gpu_tables.py docs/gpu > /tmp/gpu_tables.md

Reads docs/gpu/*_h200*.json and shakespeare_char_h200_*metrics.jsonl (copied from
scripts/gpu_session.sh runs) and prints the markdown block that docs/benchmarks/gpu.md carries
between its `<!-- gpu-tables -->` markers
(tests/scripts/test_gpu_tables.py checks that the doc holds exactly this output).
"""

import json
import os
import sys

IMPLS = ("pallas", "cudnn", "mha_bundled", "xla")
PUBLISHED_VAL_LOSS = 1.4697  # nanoGPT README, shakespeare-char, best val loss


def _load(results, name):
  with open(os.path.join(results, name)) as f:
    return json.load(f)


def _load_jsonl(results, name):
  with open(os.path.join(results, name)) as f:
    return [json.loads(line) for line in f if line.strip()]


def attention_table(data):
  rows = {(r["impl"], r["variant"], r["seq_len"], r["head_dim"], r["causal"]): r
          for r in data["rows"] if r["status"] == "ok"}
  keys = sorted({(r["head_dim"], r["seq_len"], r["causal"]) for r in data["rows"]})
  out = ["| D | L | causal | " + " | ".join(IMPLS) + " | ours / bundled mha (fwd) |",
         "|---|---|---|" + "---|" * len(IMPLS) + "---|"]
  for head_dim, seq_len, causal in keys:
    cells = []
    for impl in IMPLS:
      r = rows.get((impl, "base", seq_len, head_dim, causal))
      cells.append("-" if r is None else f"{r['fwd_tflops']:.0f} / {r['fwd_bwd_tflops']:.0f}")
    ours = rows.get(("pallas", "base", seq_len, head_dim, causal))
    peer = rows.get(("mha_bundled", "base", seq_len, head_dim, causal))
    ratio = "-" if not (ours and peer) else f"{ours['fwd_tflops'] / peer['fwd_tflops']:.2f}x"
    out.append(f"| {head_dim} | {seq_len} | {'yes' if causal else 'no'} | " + " | ".join(cells)
               + f" | {ratio} |")
  return out


def variant_table(data):
  out = ["| D | L | ALiBi fwd | ALiBi fwd+bwd | GQA 4:1 fwd | GQA 4:1 fwd+bwd |",
         "|---|---|---|---|---|---|"]
  checks = {(c["variant"], c["seq_len"], c["head_dim"], c["metric"]): c["ratio_to_causal"]
            for c in data["variant_checks"] if c["impl"] == "pallas"}
  for head_dim, seq_len in sorted({(k[2], k[1]) for k in checks}):
    cells = [f"{checks[(v, seq_len, head_dim, m)]:.2f}" for v in ("alibi", "gqa")
             for m in ("fwd_ms", "fwd_bwd_ms")]
    out.append(f"| {head_dim} | {seq_len} | " + " | ".join(cells) + " |")
  return out


def tuning_table(data, old):
  """Winners per head_dim, with the time of the backward tiling the table held before (`old`)."""
  out = ["| D | forward (bq x bk, warps, stages) | fwd ms (TFLOP/s) | backward | fwd+bwd ms "
         "(TFLOP/s) | fwd+bwd ms with the previous backward | candidates / failed to compile |",
         "|---|---|---|---|---|---|---|"]
  tile = lambda t: f"{t['block_q']}x{t['block_k']}, {t['num_warps']}, {t['num_stages']}"
  for key, best in sorted(data["best"].items(), key=lambda kv: int(kv[0].split(",")[0])):
    head_dim = int(key.split(",")[0])
    mine = [r for r in data["forward"] + data["backward"] if r["head_dim"] == head_dim]
    ok = [r for r in mine if r["status"] == "ok"]
    fwd = min((r for r in ok if "fwd_bwd_ms" not in r), key=lambda r: r["fwd_ms"])
    bwd = min((r for r in ok if "fwd_bwd_ms" in r), key=lambda r: r["fwd_bwd_ms"])
    previous = [r["fwd_bwd_ms"] for r in ok
                if "fwd_bwd_ms" in r and r["tilings"]["backward"] == old.get(head_dim)]
    out.append(f"| {head_dim} | {tile(best['forward'])} | {fwd['fwd_ms']:.3f} "
               f"({fwd['fwd_tflops']:.0f}) | {tile(best['backward'])} | {bwd['fwd_bwd_ms']:.3f} "
               f"({bwd['fwd_bwd_tflops']:.0f}) | "
               f"{f'{previous[0]:.3f}' if previous else '-'} | "
               f"{len(mine)} / {len(mine) - len(ok)} |")
  return out


TRAIN_RUNS = (  # (file, what changed): GPT-2 small's step as the code changed, oldest first
    ("train_gpt2_small_h200.json", "gpt2_small, bf16, attention pallas (the profiled step below: "
     "token table cast to bf16 before the gather)"),
    ("train_gpt2_small_h200_f32_embed.json", "+ gather float32 rows, then cast "
     "(`tfjax.nn.models.lookup`: the embedding gradient's scatter-add accumulates in float32)"),
    ("train_gpt2_small_h200_vocab50304.json", "+ vocabulary padded to 50304 = 393 x 128 "
     "(`--config.model.vocab_size=50304`, nanoGPT's choice)"))


def train_table(runs):
  gib = lambda b: f"{b / 2 ** 30:.2f}"
  out = ["| config | tokens / step | step ms | tokens/s | MFU (of 989 TFLOP/s) | compile s | "
         "compiled GiB (temp) | device peak GiB |", "|---|---|---|---|---|---|---|---|"]
  for label, data in runs:
    out.append(f"| {label} | {data['batch_size']} x {data['seq_len']} | "
               f"{data['step_ms']:.1f} | {data['tokens_per_s']:,.0f} | {100 * data['mfu']:.1f}% | "
               f"{data['compile_s']:.0f} | {gib(data['compiled_total_bytes'])} "
               f"({gib(data['temp_bytes'])}) | {gib(data['device_peak_bytes'])} |")
  return out


def recipe_table(rows):
  evals = [(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r]
  best_step, best = _best(rows)
  shown = [e for e in evals if e[0] % 1000 == 0 or e[0] == best_step]
  return ["| step | " + " | ".join(str(s) for s, _ in shown) + " |",
          "|---|" + "---|" * len(shown),
          "| val loss | " + " | ".join(f"**{v:.4f}**" if s == best_step else f"{v:.4f}"
                                      for s, v in shown) + " |",
          "", f"Best val loss {best:.4f} at step {best_step} (published {PUBLISHED_VAL_LOSS}; "
          f"difference {best - PUBLISHED_VAL_LOSS:+.4f})."]


MEMORY_BOUND = ("elementwise/other fusion", "reduction", "copy/transpose", "memcpy")


def _by_kind(profile):
  """Measured ms per step in the kernel-sum model's kinds (memory-bound kinds merged)."""
  cats = profile["by_category_s"]
  return {"matmul": cats.get("matmul", 0.0), "attention": cats.get("attention", 0.0),
          "memory": sum(cats.get(c, 0.0) for c in MEMORY_BOUND),
          "launch gaps": profile["span_s_per_step"] - profile["busy_s_per_step"]}


def profile_table(before, after):
  """Device time per kernel kind of the GPT-2 small step, cross-entropy by gather vs by mask."""
  kinds = ["matmul", "attention"] + list(MEMORY_BOUND)
  ms = lambda data, kind: data["profile"]["by_category_s"].get(kind, 0.0) * 1e3
  out = ["| device time per step (ms) | log p[target] by gather (take_along_axis) | by masked "
         "sum (tfjax.training.optim.losses) |", "|---|---|---|"]
  for kind in kinds:
    if ms(before, kind) or ms(after, kind):
      out.append(f"| {kind} | {ms(before, kind):.2f} | {ms(after, kind):.2f} |")
  for label, key in (("all kernels", "kernel_s_per_step"), ("device busy", "busy_s_per_step")):
    out.append(f"| {label} | {before['profile'][key] * 1e3:.2f} | {after['profile'][key] * 1e3:.2f} |")
  out.append(f"| step (wall) | {before['step_ms']:.1f} | {after['step_ms']:.1f} |")
  out.append(f"| tokens/s | {before['tokens_per_s']:,.0f} | {after['tokens_per_s']:,.0f} |")
  out.append(f"| MFU | {100 * before['mfu']:.1f}% | {100 * after['mfu']:.1f}% |")
  top = after["profile"]["top_kernels"][:5]
  out += ["", "Largest kernels after: " + "; ".join(
      f"{k['kernel'][:48]} ({k['category']}) {k['ms_per_step']:.2f} ms" for k in top) + "."]
  return out


def peaks_line(peaks):
  return [f"Achieved ceilings ({peaks['device']}, jax {peaks['jax']}, `experiments/bench_peaks.py`"
          f"): bf16 GEMM {peaks['gemm_n']}^3 {peaks['gemm_tflops']:.0f} TFLOP/s "
          f"({peaks['gemm_tflops'] / 989:.2f} of 989); element-wise pass over {peaks['copy_mib']} "
          f"MiB {peaks['copy_gb_per_s']:.0f} GB/s read + write ({peaks['copy_gb_per_s'] / 4800:.2f}"
          " of 4.8 TB/s)."]


def aot_table(aot, measured):
  """The ahead-of-time prediction (tfjax.aot on a CPU host) against the measured step."""
  gib = lambda b: f"{b / 2 ** 30:.2f} GiB"
  step = measured["step_ms"] / 1e3
  kinds = _by_kind(measured["profile"])
  predicted = aot["kernel_sum_s_by_kind"]
  out = ["| quantity | predicted | measured | measured / predicted |", "|---|---|---|---|",
         f"| memory per device | {gib(aot['bytes_per_device'])} | "
         f"{gib(measured['device_peak_bytes'])} (device peak) | "
         f"{measured['device_peak_bytes'] / aot['bytes_per_device']:.2f} |",
         f"| step, roofline (max of compute {aot['roofline_compute_s'] * 1e3:.2f} ms and memory "
         f"{aot['roofline_memory_s'] * 1e3:.2f} ms) | {aot['est_step_s'] * 1e3:.2f} ms | "
         f"{step * 1e3:.2f} ms | {step / aot['est_step_s']:.2f} |",
         f"| step, kernel sum | {aot['est_step_kernel_sum_s'] * 1e3:.2f} ms | {step * 1e3:.2f} ms"
         f" | {step / aot['est_step_kernel_sum_s']:.2f} |"]
  for kind in ("matmul", "attention", "memory", "launch gaps"):
    if kind in predicted:
      out.append(f"| - {kind} | {predicted[kind] * 1e3:.2f} ms | {kinds[kind] * 1e3:.2f} ms | "
                 f"{kinds[kind] / predicted[kind]:.2f} |")
  return out


def _best(rows):
  return min(((r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r), key=lambda e: e[1])


def _steady_rate(rows):
  """The median logged train tokens/s, the slowest log (the one with the compilation) left out."""
  rates = sorted(r["train/tokens_per_sec"] for r in rows if "train/tokens_per_sec" in r)[1:]
  return rates[len(rates) // 2]


AOT_RUNS = (  # (AOT JSON, measured bench_train JSON, what): the programs as the code stands
    ("aot_gpt2_small_h200_f32_embed.json", "train_gpt2_small_h200_f32_embed.json",
     "vocabulary 50257"),
    ("aot_gpt2_small_h200_vocab50304.json", "train_gpt2_small_h200_vocab50304.json",
     "vocabulary 50304"))


def aot_totals_table(runs):
  """Predicted step (kernel sum and roofline) and memory against the measured ones, per run."""
  out = ["| GPT-2 small step | kernel sum predicted | roofline predicted | measured | measured / "
         "kernel sum | measured / roofline | memory predicted / device peak |",
         "|---|---|---|---|---|---|---|"]
  for label, aot, measured in runs:
    step = measured["step_ms"] / 1e3
    out.append(f"| {label} | {aot['est_step_kernel_sum_s'] * 1e3:.2f} ms | "
               f"{aot['est_step_s'] * 1e3:.2f} ms | {step * 1e3:.2f} ms | "
               f"{step / aot['est_step_kernel_sum_s']:.2f} | {step / aot['est_step_s']:.2f} | "
               f"{aot['bytes_per_device'] / 2 ** 30:.2f} / "
               f"{measured['device_peak_bytes'] / 2 ** 30:.2f} GiB |")
  return out


def recipe_tokens_per_step() -> int:
  """Batch x context of configs/shakespeare_char.py's GPU recipe, read from the config."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sys.path.insert(0, repo)  # run as a script: tfjax from this checkout
  spec = importlib.util.spec_from_file_location(
      "shakespeare_char", os.path.join(repo, "configs", "shakespeare_char.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  return config.train.batch_size * config.data.seq_len


def recipe_aot_line(aot, ours):
  """The recipe's ahead-of-time kernel sum against our measured step (median logged tokens/s)."""
  step_ms = recipe_tokens_per_step() / _steady_rate(ours) * 1e3
  kinds = ", ".join(f"{kind} {seconds * 1e3:.2f}" for kind, seconds in
                    sorted(aot["kernel_sum_s_by_kind"].items()))
  return [f"The recipe's step ahead of time (`{aot['command']}`; {aot['program']}): kernel sum "
          f"{aot['est_step_kernel_sum_s'] * 1e3:.2f} ms ({kinds} ms) against {step_ms:.2f} ms "
          f"measured, {step_ms / aot['est_step_kernel_sum_s'] / 1e3:.2f}x."]


def nanogpt_table(torch, ours_runs):
  """nanoGPT in PyTorch against our runs of the same recipe (`ours_runs`: (attention dropout,
  metrics rows)), on the same kind of GPU: best val loss and the steady train-step speed (ours:
  the median of the logged tokens/s)."""
  tokens_per_step = torch["tokens_per_s"] * torch["step_ms"] / 1e3 if torch["step_ms"] else 0
  ms = lambda x: "-" if x is None else f"{x:.2f}"
  out = ["| run | attention dropout | best val loss (step) | steps run | ms per train step | "
         "tokens/s | wall s (train + eval) |", "|---|---|---|---|---|---|---|",
         f"| nanoGPT recipe, PyTorch {torch['torch']} ({torch['autocast']}, torch.compile "
         f"{torch['compile']}) | 0.2 | {torch['best_val_loss']:.4f} ({torch['best_val_step']}) | "
         f"{torch['steps_done']} of {torch['steps']} | {ms(torch['step_ms'])} | "
         f"{torch['tokens_per_s'] or 0:,.0f} | {torch['wall_s']:.0f} ({torch['train_s']:.0f} + "
         f"{torch['eval_s']:.0f}) |"]
  for dropout, ours in ours_runs:
    best_step, best = _best(ours)
    rate = _steady_rate(ours)
    last = max(r["step"] for r in ours)
    out.append(f"| tfjax, configs/shakespeare_char.py | {dropout:g} | {best:.4f} ({best_step}) | "
               f"{last} | {ms(tokens_per_step / rate * 1e3 if tokens_per_step else None)} | "
               f"{rate:,.0f} | - |")
  return out


def mosaic_table(data, bundled):
  """Forward TFLOP/s of our two forward kernels and cuDNN (one process), with JAX's bundled
  Pallas mha from the full sweep (`bundled`) for the 1.3x target."""
  rows = {(r["impl"], r["seq_len"], r["head_dim"], r["causal"]): r["fwd_tflops"]
          for r in data["rows"] if r["status"] == "ok"}
  mha = {(r["seq_len"], r["head_dim"], r["causal"]): r["fwd_tflops"] for r in bundled["rows"]
         if r["impl"] == "mha_bundled" and r["variant"] == "base" and r["status"] == "ok"}
  out = ["| D | L | causal | ours, Mosaic GPU forward | ours, Triton forward | cuDNN | bundled "
         "mha | Mosaic / bundled mha |", "|---|---|---|---|---|---|---|---|"]
  for seq_len, head_dim, causal in sorted({k[1:] for k in rows}, key=lambda k: (k[1], k[0], k[2])):
    get = lambda impl: rows.get((impl, seq_len, head_dim, causal))
    ours, peer = get("pallas_mosaic"), mha.get((seq_len, head_dim, causal))
    cell = lambda x: "-" if x is None else f"{x:.0f}"
    ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
    out.append(f"| {head_dim} | {seq_len} | {'yes' if causal else 'no'} | {cell(ours)} | "
               f"{cell(get('pallas'))} | {cell(get('cudnn'))} | {cell(peer)} | {ratio} |")
  return out


def main(results):
  load = lambda name: _load(results, name)
  attention, tuning, alibi = load("attention_h200.json"), load("tuning_h200.json"), load(
      "alibi_h200.json")
  train, before = load("train_gpt2_small_h200.json"), load(
      "train_gpt2_small_h200_gather_loss.json")
  recipe, no_attention_dropout = (_load_jsonl(results, f"shakespeare_char_h200_{name}.jsonl")
                                  for name in ("metrics", "no_attention_dropout_metrics"))
  # The backward tiling GPU_TILINGS held before tuning (64x64, 4 warps for D 64 and 8 warps for
  # D 128, 2 stages), to show what tuning changed.
  old = {64: dict(block_q=64, block_k=64, num_warps=4, num_stages=2),
         128: dict(block_q=64, block_k=64, num_warps=8, num_stages=2)}
  meta = lambda d: f"{d['meta']['device']}, jax {d['meta']['jax']}, {d['meta']['date'][:10]}"
  blocks = [["Attention, TFLOP/s forward / forward+backward (bf16, d_model 2048, batch x L = "
             f"16k tokens; ours with the Triton forward; {meta(attention)}):", ""]
            + attention_table(attention),
            ["Forward only, ours with each forward kernel beside cuDNN (one process; bundled mha "
             f"from the table above; {meta(load('mosaic_forward_h200.json'))}). `pallas` takes "
             "the Mosaic forward by default on Hopper where it applies (bf16, D 64/128, no ALiBi,"
             " window or segments):", ""]
            + mosaic_table(load("mosaic_forward_h200.json"), attention),
            ["Our kernel's cost relative to plain causal, Triton forward and backward, ALiBi as a "
             f"per-key bias (time ratio; target < 1.10; {meta(alibi)}):", ""]
            + variant_table(alibi),
            ["Tuning (`--tune`, causal, L 4096, bf16):", ""] + tuning_table(tuning, old),
            ["GPT-2 small training step (each row changes one thing from the row above):", ""]
            + train_table([(label, load(name)) for name, label in TRAIN_RUNS]),
            ["Where the step's time goes (`experiments/bench_train.py --profile_steps=5`, device "
             "time per kernel kind from the profiler trace; the first row's config, and the "
             "same with the loss's gather before it):", ""]
            + profile_table(before, train),
            peaks_line(load("peaks_h200.json")),
            ["The ahead-of-time estimate against the measured step, kind by kind (the profiled "
             "step's program, the first row of the training table; `python -m tfjax.aot "
             "--target=h200x1`, compiled on a 2-core CPU host, jax 0.10.2):", ""]
            + aot_table(load("aot_gpt2_small_h200.json"), train),
            ["The same estimate for the programs as the code now stands (the training table's "
             "second and third rows; same command with `--config.model.vocab_size` as measured):",
             ""] + aot_totals_table([(label, load(aot), load(measured))
                                     for aot, measured, label in AOT_RUNS]),
            ["nanoGPT's shakespeare-char GPU recipe (5000 steps, seed 0, attention dropout 0.2 "
             "as nanoGPT), val loss on 200 batches every 250 steps:", ""] + recipe_table(recipe),
            ["Side by side with nanoGPT in PyTorch on the same kind of GPU (`scripts/"
             "gpu_phase_nanogpt.sh`, stopped by its time limit; ours with attention dropout runs "
             "`xla` attention, the fused kernels take no dropout):", ""]
            + nanogpt_table(load("nanogpt_torch_h200.json"),
                            [(0.0, no_attention_dropout), (0.2, recipe)]),
            recipe_aot_line(load("aot_shakespeare_char_h200.json"), no_attention_dropout)]
  print("\n\n".join("\n".join(b) for b in blocks))


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "docs/gpu")
