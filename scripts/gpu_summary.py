"""Summary tables of one scripts/gpu_session.sh run (markdown on stdout).

  python scripts/gpu_summary.py bench_results/gpu

Reads what each phase wrote (missing phases are skipped): the tests' junit XML, the attention
benchmark's results.json, every bench_train.json, the recipes' metrics.jsonl, bench_peaks.json
and tuning.json.
"""

import json
import os
import sys
import xml.etree.ElementTree as ET


def load_json(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def tests(results):
  path = os.path.join(results, "tests.xml")
  if not os.path.exists(path):
    return []
  root = ET.parse(path).getroot()
  suite = root if root.tag == "testsuite" else root.find("testsuite")
  counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
  lines = [f"tests: {counts['tests']} run, {counts['failures']} failed, {counts['errors']} "
           f"errors, {counts['skipped']} skipped"]
  for case in suite.iter("testcase"):
    for bad in list(case.findall("failure")) + list(case.findall("error")):
      message = (bad.get("message") or "").splitlines()[0][:160] if bad.get("message") else ""
      lines.append(f"  FAIL {case.get('name')}: {message}")
  return lines


def attention(results):
  data = load_json(os.path.join(results, "attention", "results.json"))
  if not data:
    return []
  lines = [f"attention ({data['meta']['device']}, jax {data['meta']['jax']}): TFLOP/s fwd / "
           "fwd+bwd", "| impl | variant | L | D | causal | fwd | fwd+bwd | status |",
           "|---|---|---|---|---|---|---|---|"]
  fmt = lambda x: "-" if x is None else f"{x:.0f}"
  for r in data["rows"]:
    lines.append(f"| {r['impl']} | {r['variant']} | {r['seq_len']} | {r['head_dim']} | "
                 f"{'c' if r['causal'] else 'f'} | {fmt(r.get('fwd_tflops'))} | "
                 f"{fmt(r.get('fwd_bwd_tflops'))} | {r['status'][:40]} |")
  for c in data.get("variant_checks", []):
    if c["impl"] == "pallas":
      lines.append(f"  variant {c['variant']} L{c['seq_len']} D{c['head_dim']} {c['metric']}: "
                   f"{c['ratio_to_causal']:.3f} x causal")
  return lines


def train(results, folder="train"):
  data = load_json(os.path.join(results, folder, "bench_train.json"))
  if not data:
    return []
  mfu = data.get("mfu")
  gib = lambda b: "-" if b is None else f"{b / 2**30:.2f} GiB"
  lines = []
  for cat, sec in data.get("profile", {}).get("by_category_s", {}).items():
    lines.append(f"  {cat}: {sec * 1e3:.2f} ms/step")
  if "profile" in data:
    p = data["profile"]
    lines.append(f"  kernels {p['kernel_s_per_step'] * 1e3:.2f} ms, busy "
                 f"{p['busy_s_per_step'] * 1e3:.2f} ms, span {p['span_s_per_step'] * 1e3:.2f} ms"
                 f", {p['launches_per_step']:.0f} launches per step")
    lines += [f"  {k['ms_per_step']:.2f} ms {k['category']} {k['hlo_op']} {k['kernel'][:70]}"
              for k in p["top_kernels"][:12]]
  config = os.path.splitext(os.path.basename(str(data.get("config", "?"))))[0]
  return [f"{folder} {config}: {data['batch_size']}x{data['seq_len']} tokens, step "
          f"{data['step_ms']:.1f} ms, {data['tokens_per_s']:.0f} tokens/s, MFU "
          f"{'-' if mfu is None else f'{100 * mfu:.1f}%'}, compile {data['compile_s']:.0f} s, "
          f"compiled {gib(data.get('compiled_total_bytes'))}, temp {gib(data.get('temp_bytes'))},"
          f" device peak {gib(data.get('device_peak_bytes'))}"] + lines


# Every bench_train.py folder gpu_session.sh writes besides `train`, in its phase order.
TRAIN_FOLDERS = ("train_vocab", "train_cublas", "profile_recipe_float32", "profile_recipe_bfloat16",
                 "profile_pallas", "profile_cudnn", "profile_xla")


def profiles(results):
  lines = []
  for folder in TRAIN_FOLDERS:
    lines += train(results, folder)
  return lines


def recipe(results):
  lines = []
  for name in ("recipe", "recipe_bf16"):
    path = os.path.join(results, f"{name}_metrics.jsonl")
    if not os.path.exists(path):
      continue
    rows = [json.loads(line) for line in open(path) if line.strip()]
    evals = [(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r]
    if not evals:
      lines.append(f"{name}: no eval yet")
      continue
    best = min(evals, key=lambda e: e[1])
    times = [r.get("time/elapsed_s") for r in rows if r.get("time/elapsed_s") is not None]
    lines.append(f"{name} shakespeare_char: last eval step {evals[-1][0]} loss "
                 f"{evals[-1][1]:.4f}; best {best[1]:.4f} at step {best[0]}"
                 + (f"; elapsed {times[-1]:.0f} s" if times else ""))
  return lines


def tune(results):
  data = load_json(os.path.join(results, "tune", "tuning.json"))
  if not data:
    return []
  return [f"tune {key}: {json.dumps(value)}" for key, value in data.get("best", {}).items()]


def peaks(results):
  data = load_json(os.path.join(results, "peaks", "bench_peaks.json"))
  if not data:
    return []
  float32 = data.get("gemm_float32_tflops")
  lines = [f"peaks ({data['device']}): GEMM {data['gemm_n']}^3 bf16 {data['gemm_tflops']:.0f} "
           f"TFLOP/s" + ("" if float32 is None else f", float32 {float32:.0f} TFLOP/s") +
           f"; copy {data['copy_mib']} MiB {data['copy_gb_per_s']:.0f} GB/s (read + write)"]
  batch = lambda g: f"{g['batch']}x" if g.get("batch", 1) > 1 else ""
  return lines + [f"  GEMM {batch(g)}{g['m']}x{g['k']}x{g['n']} {g['dtype']}: {g['tflops']:.0f} "
                  f"TFLOP/s ({g['ms']:.3f} ms)" for g in data.get("gemms", [])]


def nanogpt(results):
  data = load_json(os.path.join(results, "nanogpt", "torch_nanogpt_reference.json"))
  if not data:
    return []
  fmt = lambda x, spec: "-" if x is None else format(x, spec)
  return [f"nanogpt torch {data['torch']} on {data['device_name']}: best val "
          f"{data['best_val_loss']:.4f} at step {data['best_val_step']}, {data['steps_done']} of "
          f"{data['steps']} steps, wall {data['wall_s']:.0f} s (train {data['train_s']:.0f}, eval "
          f"{data['eval_s']:.0f}), {fmt(data['step_ms'], '.2f')} ms/step, compile {data['compile']}"]


def phases(results):
  path = os.path.join(results, "phases.tsv")
  if not os.path.exists(path):
    return []
  rows = [line.split("\t") for line in open(path).read().splitlines() if line]
  return ["phases (name rc seconds): " + ", ".join(" ".join(r) for r in rows)]


def main(results):
  for section in (phases, tests, peaks, nanogpt, profiles, attention, train, recipe, tune):
    try:
      lines = section(results)
    except Exception as e:  # pylint: disable=broad-except  # a summary never hides the others
      lines = [f"{section.__name__}: could not summarise ({type(e).__name__}: {e})"]
    if lines:
      print("\n".join(lines) + "\n")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "bench_results/gpu")
