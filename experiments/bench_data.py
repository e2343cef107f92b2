"""Data pipeline benchmarks: tfjax-prepare against the HF tokenizers ceiling, the prepared loader's
tokens/s (random windows and packed rows), and the loader's memory against corpus size.

  python experiments/bench_data.py --out=bench_results [--text_mb=20] [--tokenizer=hf:DIR]
      [--workers=1,2] [--corpus_mb=100,1000] [--batches=3000]
      [--grain_batches=1000] [--grain_workers=0,2] [--grain_corpus_mb=100]

1. Prepare: --text_mb of text (Tiny Shakespeare repeated, a document per paragraph) tokenized
   by `tokenizers` encode_batch in one process on every core (the ceiling: no reading, writing or
   checksums), then by tfjax-prepare with each --workers value, end to end. Tokenizer: --tokenizer
   (e.g. hf:DIR with GPT-2's tokenizer.json), else a 8,192-id byte-level BPE trained here.
2. Loader: prepared directories of --corpus_mb megabytes of uint16 tokens (random ids, documents
   of 1 to 2,000 tokens, 100M-token shards), each opened in a fresh process that draws --batches
   global batches of 12 x 1024 (random windows, then packed rows): tokens/s, and the process's
   resident memory (VmRSS, and RssAnon: memory that is not the memory-mapped corpus itself).
   The shards were just written, so they sit in the page cache: this is the loader's own speed.
   Then a training process (configs/gpt2_owt.py:smoke, --train_steps) on each corpus: its memory.
3. grain (experiments/bench_data_grain.py; skipped, saying so, when grain or array_record is not
   installed, or with --grain_batches=0): on a --grain_corpus_mb directory, grain's DataLoader
   over the prepared shards (each --grain_workers count) against the loader above, and
   ArrayRecord random reads of the same windows against pread.
Writes OUT/bench_data.json and OUT/bench_data.md stamped with the machine, JAX version and date.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, SEQ_LEN = 12, 1024
SHARD_TOKENS = 100_000_000


def shakespeare_docs(text_mb: float) -> list[str]:
  from tfjax.data.datasets import tinyshakespeare_path  # pylint: disable=import-outside-toplevel
  text = open(tinyshakespeare_path(), encoding="utf-8").read()
  paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
  docs, size = [], 0
  while size < text_mb * 1e6:
    for p in paragraphs:
      docs.append(p)
      size += len(p)
  return docs


def bpe_dir(docs: list[str], directory: str) -> str:
  import tokenizers as hf  # pylint: disable=import-outside-toplevel
  tok = hf.Tokenizer(hf.models.BPE())
  tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf.decoders.ByteLevel()
  tok.train_from_iterator(docs[:20000], hf.trainers.BpeTrainer(
      vocab_size=8192, special_tokens=["<|endoftext|>"], show_progress=False,
      initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()))
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>"}, f)
  return f"hf:{directory}"


def bench_prepare(args, tmp: str) -> list[dict]:
  from tfjax.data import prepare as prep, tokenizer_spec  # pylint: disable=import-outside-toplevel
  import tokenizers as hf  # pylint: disable=import-outside-toplevel
  docs = shakespeare_docs(args.text_mb)
  text_path = os.path.join(tmp, "corpus.jsonl")
  with open(text_path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
  flag = args.tokenizer or bpe_dir(docs, os.path.join(tmp, "bpe"))
  tok = hf.Tokenizer.from_str(tokenizer_spec.resolve(flag).state["hf_tokenizer"])
  rows = []
  for repeat in range(args.repeats):
    start = time.perf_counter()
    tokens = sum(len(e.ids) for i in range(0, len(docs), 1024)
                 for e in tok.encode_batch(docs[i:i + 1024]))
    seconds = time.perf_counter() - start
    rows.append({"what": "ceiling: tokenizers encode_batch (all cores)", "repeat": repeat,
                 "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
    for workers in args.workers:
      out = os.path.join(tmp, f"prepared_{workers}_{repeat}")
      start = time.perf_counter()
      manifest = prep.prepare(text_path, flag, out, workers=workers, shard_mb=args.shard_mb,
                              progress=False)
      seconds = time.perf_counter() - start
      total = sum(manifest["splits"][s]["num_tokens"] for s in ("train", "val"))
      total -= manifest["num_docs"]  # the appended end-of-text ids are not the tokenizer's work
      rows.append({"what": f"tfjax-prepare --workers={workers}", "repeat": repeat,
                   "tokens": total, "seconds": seconds, "tokens_per_s": total / seconds})
  return rows


def write_corpus(directory: str, megabytes: int, seed: int = 0) -> None:
  """A prepared directory of random byte ids in documents of 1..2000 tokens (format of
  tfjax.data.manifest, written directly: no text to tokenize)."""
  from tfjax.data import manifest as mf  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  total, shards = megabytes * 1_000_000 // 2, []
  for index, start in enumerate(range(0, total, SHARD_TOKENS)):
    n = min(SHARD_TOKENS, total - start)
    lengths = rng.integers(1, 2001, size=n // 1000 + 1)
    ends = np.minimum(np.cumsum(lengths), n).astype(np.uint64)
    ends = np.unique(np.concatenate([ends, [n]]))
    shard = {"tokens": mf.tokens_file("train", index), "docs": mf.docs_file("train", index),
             "num_tokens": int(n), "num_docs": len(ends)}
    np.save(os.path.join(directory, shard["tokens"]), rng.integers(0, 256, n, dtype=np.uint16))
    np.save(os.path.join(directory, shard["docs"]), ends)
    shard["sha256"] = mf.shard_sha256(directory, shard)
    shards.append(shard)
  val = {"tokens": mf.tokens_file("val", 0), "docs": mf.docs_file("val", 0),
         "num_tokens": 100_000, "num_docs": 100}
  np.save(os.path.join(directory, val["tokens"]), rng.integers(0, 256, 100_000, dtype=np.uint16))
  np.save(os.path.join(directory, val["docs"]), np.arange(1000, 100_001, 1000, dtype=np.uint64))
  val["sha256"] = mf.shard_sha256(directory, val)
  with open(os.path.join(directory, mf.TOKENIZER), "w") as f:
    json.dump({"type": "byte"}, f)
  manifest = {"format": mf.FORMAT, "dtype": "uint16",
              "tokenizer": {"name": "byte", "spec": "byte", "vocab_size": 256, "eos_id": None,
                            "sha256": mf.tokenizer_sha256({"type": "byte"}), "file": mf.TOKENIZER},
              "splits": {"train": {"shards": shards, "num_tokens": int(total),
                                   "num_docs": sum(s["num_docs"] for s in shards)},
                         "val": {"shards": [val], "num_tokens": 100_000, "num_docs": 100}},
              "num_docs": 0, "sources": [], "settings": {}, "bad_utf8": {}}
  with open(os.path.join(directory, mf.MANIFEST), "w") as f:
    json.dump(manifest, f)


def memory_kb() -> dict:
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
        out[key] = int(value.split()[0])
  return out


def loader_child(directory: str, batches: int) -> dict:
  """Runs in a fresh process: draws batches in both modes, returns speeds and memory."""
  from tfjax.data.prepared import PreparedDataset  # pylint: disable=import-outside-toplevel
  result = {"before_open": memory_kb()}
  for mode in ("random", "packed"):
    ds = PreparedDataset(directory, seq_len=SEQ_LEN, mode=mode, verify="size")
    ds.train_batch(0, ROWS)
    start = time.perf_counter()
    for index in range(1, batches + 1):
      ds.train_batch(index, ROWS)
    seconds = time.perf_counter() - start
    result[mode] = {"batches": batches, "seconds": seconds,
                    "tokens_per_s": batches * ROWS * SEQ_LEN / seconds,
                    "ms_per_batch": 1e3 * seconds / batches}
  result["after"] = memory_kb()
  return result


def train_child(directory: str, steps: int) -> dict:
  """Runs in a fresh process: configs/gpt2_owt.py:smoke for `steps` steps on the corpus."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(REPO, "configs",
                                                                    "gpt2_owt.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("smoke")
  config.data.path = directory
  config.train.update(num_steps=steps, eval_every=steps, checkpoint_every=steps, log_every=steps)
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    train.train_and_evaluate(config, workdir)
    seconds = time.perf_counter() - start
  return {"steps": steps, "seconds": seconds, "after": memory_kb()}


def bench_loader(args, tmp: str) -> list[dict]:
  rows = []
  for megabytes in args.corpus_mb:
    directory = os.path.join(tmp, f"corpus_{megabytes}mb")
    write_corpus(directory, megabytes)
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f"--_loader={directory}",
         f"--batches={args.batches}"], capture_output=True, text=True, check=True,
        env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    row = {"corpus_mb": megabytes, **json.loads(child.stdout.strip().splitlines()[-1])}
    if args.train_steps:
      child = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--_train={directory}",
           f"--train_steps={args.train_steps}"], capture_output=True, text=True, check=True,
          env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
      row["train"] = json.loads(child.stdout.strip().splitlines()[-1])
    rows.append(row)
    for name in os.listdir(directory):
      os.remove(os.path.join(directory, name))
  return rows


def bench_grain(args, tmp: str) -> dict:
  import bench_data_grain as grain_bench  # pylint: disable=import-outside-toplevel
  missing = grain_bench.available()
  if missing:
    return {"skipped": missing}
  directory = os.path.join(tmp, f"grain_{args.grain_corpus_mb}mb")
  write_corpus(directory, args.grain_corpus_mb)
  return {"corpus_mb": args.grain_corpus_mb,
          "versions": {name: importlib.metadata.version(name)
                       for name in ("grain", "array_record")},
          "loaders": grain_bench.bench_loaders(directory, args.grain_batches, args.grain_repeats,
                                               args.grain_workers),
          "random_access": grain_bench.bench_random_access(directory, args.grain_batches,
                                                           args.grain_repeats)}


def gpt2_consumption() -> dict:
  """Tokens/s GPT-2 small trains at on one H100 at 50% MFU: FLOPs per token = 6N plus the
  attention term 12 * layers * d_model * context (PaLM's appendix B; nanoGPT's estimate_mfu)."""
  n, layers, d, context, peak = 124e6, 12, 768, 1024, 989e12
  per_token = 6 * n + 12 * layers * d * context
  tokens_per_s = 0.5 * peak / per_token
  return {"flops_per_token": per_token, "tokens_per_s": tokens_per_s,
          "target_20x": 20 * tokens_per_s}


def markdown(report: dict) -> str:
  env = report["env"]
  lines = [f"bench_data: {env['machine']}, {env['cpus']} CPUs, jax {env['jax']}, {env['date']}",
           "", "| prepare | tokens | s | tokens/s | / ceiling |", "| --- | --- | --- | --- | --- |"]
  best = {}
  for row in report["prepare"]:
    best[row["what"]] = max(best.get(row["what"], 0), row["tokens_per_s"])
  ceiling = next((v for k, v in best.items() if k.startswith("ceiling")), float("nan"))
  for row in report["prepare"]:
    lines.append(f"| {row['what']} (repeat {row['repeat']}) | {row['tokens']:,} | "
                 f"{row['seconds']:.2f} | {row['tokens_per_s']:,.0f} | "
                 f"{row['tokens_per_s'] / ceiling:.2f} |")
  medians = {}
  for row in report["prepare"]:
    medians.setdefault(row["what"], []).append(row["tokens_per_s"])
  if medians:
    median_ceiling = float(np.median(next(v for k, v in medians.items()
                                          if k.startswith("ceiling"))))
    lines += ["", "| prepare, median of the repeats | tokens/s | / ceiling |", "| --- | --- | --- |"]
    for what, values in medians.items():
      lines.append(f"| {what} | {np.median(values):,.0f} | {np.median(values) / median_ceiling:.2f} |")
  g = report["gpt2_h100_50mfu"]
  lines += ["", f"GPT-2 small on one H100 at 50% MFU: {g['flops_per_token'] / 1e6:,.1f} MFLOP/token"
            f" -> {g['tokens_per_s']:,.0f} tokens/s; 20x = {g['target_20x']:,.0f} tokens/s", "",
            "| corpus | mode | ms / 12x1024 batch | tokens/s | x GPT-2 H100 | VmRSS MB | "
            "RssAnon MB |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for row in report["loader"]:
    for mode in ("random", "packed"):
      lines.append(f"| {row['corpus_mb']} MB | {mode} | {row[mode]['ms_per_batch']:.3f} | "
                   f"{row[mode]['tokens_per_s']:,.0f} | "
                   f"{row[mode]['tokens_per_s'] / g['tokens_per_s']:,.0f} | "
                   f"{row['after']['VmRSS'] / 1024:.0f} | {row['after']['RssAnon'] / 1024:.0f} |")
  trained = [row for row in report["loader"] if "train" in row]
  if trained:
    lines += ["", "| corpus | training process (gpt2_owt.py:smoke) | s | VmRSS MB | RssAnon MB |",
              "| --- | --- | --- | --- | --- |"]
    for row in trained:
      t = row["train"]
      lines.append(f"| {row['corpus_mb']} MB | {t['steps']} steps | {t['seconds']:.1f} | "
                   f"{t['after']['VmRSS'] / 1024:.0f} | {t['after']['RssAnon'] / 1024:.0f} |")
  if "grain" in report:
    import bench_data_grain as grain_bench  # pylint: disable=import-outside-toplevel
    lines += grain_bench.markdown(report["grain"])
  return "\n".join(lines) + "\n"


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="bench_results")
  p.add_argument("--text_mb", type=float, default=20.0)
  p.add_argument("--tokenizer", default="", help="hf:DIR etc.; default: a BPE trained here")
  p.add_argument("--workers", default="1,2")
  p.add_argument("--shard_mb", type=float, default=4.0)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--corpus_mb", default="100,1000")
  p.add_argument("--batches", type=int, default=3000)
  p.add_argument("--train_steps", type=int, default=200, help="0: no training process")
  p.add_argument("--grain_batches", type=int, default=1000, help="0: no grain comparison")
  p.add_argument("--grain_workers", default="0,2", help="grain DataLoader worker counts")
  p.add_argument("--grain_corpus_mb", type=int, default=100)
  p.add_argument("--grain_repeats", type=int, default=3)
  p.add_argument("--_loader", default="", help=argparse.SUPPRESS)
  p.add_argument("--_train", default="", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args._train:  # pylint: disable=protected-access
    print(json.dumps(train_child(args._train, args.train_steps)))  # pylint: disable=protected-access
    return
  if args._loader:  # pylint: disable=protected-access
    print(json.dumps(loader_child(args._loader, args.batches)))  # pylint: disable=protected-access
    return
  args.workers = [int(w) for w in args.workers.split(",")]
  args.corpus_mb = [int(m) for m in args.corpus_mb.split(",") if m]
  args.grain_workers = [int(w) for w in args.grain_workers.split(",") if w]
  report = {"env": {"machine": platform.node() or platform.machine(), "cpus": os.cpu_count(),
                    "jax": importlib.metadata.version("jax"),
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                    "command": " ".join(sys.argv)},
            "gpt2_h100_50mfu": gpt2_consumption()}
  with tempfile.TemporaryDirectory() as tmp:
    report["prepare"] = bench_prepare(args, tmp) if args.text_mb > 0 else []
    report["loader"] = bench_loader(args, tmp)
    if args.grain_batches > 0:
      report["grain"] = bench_grain(args, tmp)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_data.json"), "w") as f:
    json.dump(report, f, indent=1)
  text = markdown(report)
  with open(os.path.join(args.out, "bench_data.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
