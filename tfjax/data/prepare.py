"""tfjax-prepare: tokenize a corpus once into memory-mappable token shards (tfjax.data.manifest).

    tfjax-prepare --input=FILES|GLOB|HF_DATASET_DIR --tokenizer=gpt2|bpe:DIR|hf:DIR|byte|char \
        --output=DIR [--text_field=text] [--workers=N] [--val_fraction=F | --val_docs=N] \
        [--min_val_tokens=N] [--overwrite]
    python -m tfjax.data.prepare ...   # the same (command line: tfjax/data/prepare_main.py)

Documents stream from the inputs in order (tfjax.data.sources); each goes to the validation split
when a hash of its index falls under --val_fraction (or when it is one of the first --val_docs).
The validation split always holds at least --min_val_tokens tokens (default MIN_VAL_TOKENS: a few
evaluation batches at data.seq_len <= 1024): with --val_fraction, the leading documents that hold
that many tokens go to it as well (a small corpus, e.g. Tiny Shakespeare, would otherwise get a
split of a few dozen tokens); --val_docs too few for it, or a corpus too small for a split of that
size plus training data, is an error before anything is written.
Each split is cut into shards of about --shard_mb megabytes of text, so where a shard ends depends
only on the inputs and the flags. Worker processes encode whole shards with Hugging Face
`tokenizers` batch encoding and write them; a finished shard gets a sidecar file, the last thing
written for it. Run again with the same flags after a kill and the finished shards are kept and
the rest rewritten, byte-identical to an uninterrupted run. `manifest.json` is written after the
last shard: a directory without one is never read as a prepared corpus. A finished directory, or
one holding an unfinished prepare of other inputs or flags, is replaced only with --overwrite: the
new prepare is written beside it (OUTPUT.overwrite, resumable like any other) and takes its place
only when finished, so a run that fails or is killed loses nothing of the earlier one.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import runpy
import shutil
import sys
import time
from typing import Optional

from tfjax.data import manifest as mf
from tfjax.data import shard_writer, sources, tokenizer_spec

PLAN = "prepare.json"  # the flags and inputs of an unfinished prepare (removed when finished)
USAGE_ERROR = 2
# 8 windows of 1,025 tokens: random evaluation at data.seq_len <= 1024 (configs/gpt2_owt.py's)
# finds whole windows, and sequential evaluation gets a few batches.
MIN_VAL_TOKENS = 8 * 1025
STAGING = ".overwrite"  # OUTPUT + this: where --overwrite writes the replacement


def _in_val(doc_index: int, val_fraction: float) -> bool:
  """A uniform number from the document index (splitmix64), under val_fraction."""
  z = (doc_index + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
  return ((z ^ (z >> 31)) >> 11) / float(1 << 53) < val_fraction


def _leading_val_docs(documents, encoder, eos: bool, min_tokens: int) -> tuple[int, int, int]:
  """(k, tokens, documents read): the first k documents hold `tokens` >= min_tokens tokens; when
  the inputs end first, k is every document and `tokens` all they hold."""
  count = tokens = 0
  for count, text in enumerate(documents, start=1):
    if tokens >= min_tokens:
      return count - 1, tokens, count
    tokens += len(encoder.encode_batch([text])[0]) + int(eos)
  return count, tokens, count


def _val_floor(read, spec, eos: bool, min_tokens: int, val_docs: Optional[int]) -> int:
  """How many leading documents the val split takes so that it holds >= min_tokens tokens (the
  module docstring); a clear error when --val_docs or the corpus is too small for that."""
  if min_tokens <= 0:
    return 0
  k, tokens, seen = _leading_val_docs(read(), tokenizer_spec.Encoder(spec.state), eos, min_tokens)
  if tokens < min_tokens or k >= seen:  # the inputs ended before (or at) the floor
    raise ValueError(
        f"the inputs hold {tokens:,} tokens in {seen:,} documents: too small for a validation "
        f"split of --min_val_tokens={min_tokens:,} tokens (a few evaluation batches) plus "
        "training data; lower --min_val_tokens (at least 8 x (data.seq_len + 1) is advised) or "
        "add text")
  if val_docs is not None and val_docs < k:
    raise ValueError(
        f"--val_docs={val_docs}: those documents hold fewer than --min_val_tokens="
        f"{min_tokens:,} tokens (a few evaluation batches; the first {k:,} documents hold "
        f"{tokens:,}); use --val_docs={k} or more, or lower --min_val_tokens")
  return k


def _plan_of(directory: str):
  path = os.path.join(directory, PLAN)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _target(output: str, plan: dict, overwrite: bool) -> str:
  """The directory this prepare writes: `output`, or beside it (OUTPUT.overwrite) when
  --overwrite replaces an earlier prepare there. Without --overwrite nothing is replaced."""
  if os.path.isfile(output):
    raise ValueError(f"--output={output} is a file; give a directory")
  finished = os.path.exists(os.path.join(output, mf.MANIFEST))
  if not finished and _plan_of(output) in (None, plan):
    return output  # new, empty, or our own unfinished prepare (resumed)
  if not overwrite:
    if finished:
      raise ValueError(f"--output={output} already holds a finished prepare ({mf.MANIFEST}); "
                       "nothing was changed: add --overwrite to replace it (it is kept until the "
                       "new one is finished), or choose a new --output")
    raise ValueError(f"--output={output} holds an unfinished prepare of other inputs or flags (or "
                     f"inputs that changed since; see {os.path.join(output, PLAN)}): rerun with "
                     "its flags, add --overwrite to replace it, or choose a new --output")
  staged = output.rstrip(os.sep) + STAGING
  if os.path.isdir(staged) and (os.path.exists(os.path.join(staged, mf.MANIFEST))
                                or _plan_of(staged) not in (None, plan)):
    shutil.rmtree(staged)  # an earlier replacement of other flags, or one never put in place
  return staged


def _replace(output: str, staged: str) -> None:
  """Puts the finished prepare `staged` in place of the earlier one in `output`."""
  old = output.rstrip(os.sep) + STAGING + ".old"
  if os.path.exists(old):  # left by a replace killed between its two renames
    shutil.rmtree(old)
  os.rename(output, old)
  os.rename(staged, output)
  shutil.rmtree(old)


def _check_output(output: str, plan: dict) -> None:
  """Resumes our own unfinished prepare (_target refused anyone else's), else starts one in a
  new or empty directory by recording the plan."""
  path = os.path.join(output, PLAN)
  if os.path.exists(path):
    for name in os.listdir(output):  # files a killed writer left half-written
      if ".tmp" in name:
        os.remove(os.path.join(output, name))
    return
  if os.path.isdir(output) and os.listdir(output):
    raise ValueError(f"--output={output} is not empty and holds no prepare (--overwrite replaces "
                     "only an earlier prepare); choose a new or empty directory")
  os.makedirs(output, exist_ok=True)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(plan, f, indent=1)
  os.replace(path + ".tmp", path)


class _Progress:
  """A tqdm bar over the input bytes, showing tokens/s of finished shards."""

  def __init__(self, total_bytes: int, enabled: bool):
    self.bar = None
    if enabled:
      from tqdm import tqdm  # pylint: disable=import-outside-toplevel
      self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare",
                      dynamic_ncols=True, file=sys.stderr)
    self.start, self.tokens, self.read = time.time(), 0, 0

  def update(self, bytes_read: int, tokens: int = 0) -> None:
    self.tokens += tokens
    if self.bar is not None:
      self.bar.update(bytes_read - self.read)
      if tokens:
        rate = self.tokens / max(time.time() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate:,.0f} tokens/s")
    self.read = bytes_read

  def close(self):
    if self.bar is not None:
      self.bar.close()


def prepare(inputs: str, tokenizer: str, output: str, *, text_field: str = "text",
            workers: Optional[int] = None, val_fraction: float = 0.0005,
            val_docs: Optional[int] = None, shard_mb: float = 64.0, dtype: str = "auto",
            bad_utf8: str = "replace", txt_docs: str = "paragraphs", append_eos: bool = True,
            progress: bool = True, min_val_tokens: int = MIN_VAL_TOKENS,
            overwrite: bool = False) -> dict:
  """Prepares `inputs` into `output` (see the module docstring); returns the manifest."""
  paths = sources.resolve_inputs(inputs)
  if val_docs is None and not 0.0 < val_fraction < 1.0:
    raise ValueError(f"--val_fraction={val_fraction}: must be in (0, 1)")
  if val_docs is not None and val_docs < 1:
    raise ValueError(f"--val_docs={val_docs}: must be >= 1")
  if min_val_tokens < 0:
    raise ValueError(f"--min_val_tokens={min_val_tokens}: must be >= 0 (0: no minimum)")
  if shard_mb <= 0:
    raise ValueError(f"--shard_mb={shard_mb}: must be > 0")
  workers = (os.cpu_count() or 1) if workers is None else int(workers)
  if workers < 1:
    raise ValueError(f"--workers={workers}: must be >= 1")
  source_files = [info for p in paths for info in sources.source_info(p)]
  read = lambda stats=None: sources.documents(  # noqa: E731
      paths, text_field=text_field, txt_docs=txt_docs, bad_utf8=bad_utf8, stats=stats)
  spec = tokenizer_spec.resolve(tokenizer, read() if tokenizer == "char" else None)
  token_dtype = mf.token_dtype(spec.vocab_size, dtype)
  eos_id = spec.eos_id if append_eos else None
  leading = _val_floor(read, spec, eos_id is not None, min_val_tokens, val_docs)
  settings = {"text_field": text_field, "val_fraction": None if val_docs else val_fraction,
              "val_docs": val_docs, "min_val_tokens": min_val_tokens,
              "val_leading_docs": None if val_docs else leading, "shard_mb": shard_mb,
              "dtype": token_dtype.name, "bad_utf8": bad_utf8, "txt_docs": txt_docs,
              "eos_appended": eos_id is not None}
  plan = {"inputs": [os.path.abspath(p) for p in paths], "sources": source_files,
          "tokenizer": spec.manifest_entry(), "settings": settings}
  final_output, output = output, _target(output, plan, overwrite)
  _check_output(output, plan)
  with open(os.path.join(output, mf.TOKENIZER), "w", encoding="utf-8") as f:
    json.dump(spec.state, f, ensure_ascii=False)

  stats = sources.Stats()
  bar = _Progress(sum(s["bytes"] for s in source_files), progress)
  shards = {split: [] for split in mf.SPLITS}
  pool = None
  if workers > 1:
    pool = multiprocessing.get_context("spawn").Pool(
        workers, shard_writer.init_worker, (spec.state,))
  else:
    shard_writer.init_worker(spec.state, single_thread=False)
  # (split, shard dict or a pool's AsyncResult) in submission order; bounded, so that at most
  # 2 * workers shards of text are in memory at once.
  pending = collections.deque()

  def collect(limit: int) -> None:
    while len(pending) > limit:
      split, result = pending.popleft()
      shard = result if isinstance(result, dict) else result.get()
      shards[split].append(shard)
      bar.update(stats.bytes_read, shard["num_tokens"])

  def submit(split: str, texts: list[str]) -> None:
    index = len(shards[split]) + sum(1 for s, _ in pending if s == split)
    done = shard_writer.finished(output, split, index)
    if done is not None:  # a resumed prepare keeps what a killed one finished
      pending.append((split, done))
    elif pool is not None:
      pending.append((split, pool.apply_async(
          shard_writer.write_shard,
          (output, split, index, texts, token_dtype.name, eos_id))))
    else:
      pending.append((split, shard_writer.write_shard(output, split, index, texts,
                                                      token_dtype.name, eos_id)))
    collect(2 * workers)

  try:
    buffers = {split: ([], 0) for split in mf.SPLITS}
    limit = int(shard_mb * 1e6)
    for doc_index, text in enumerate(read(stats)):
      in_val = (doc_index < val_docs if val_docs else
                doc_index < leading or _in_val(doc_index, val_fraction))
      split = "val" if in_val else "train"
      texts, size = buffers[split]
      texts.append(text)
      size += len(text)
      if size >= limit:
        submit(split, texts)
        texts, size = [], 0
      buffers[split] = (texts, size)
      if doc_index % 1024 == 0:
        bar.update(stats.bytes_read)
    for split, (texts, _) in buffers.items():
      if texts:
        submit(split, texts)
    collect(0)
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()
    bar.close()
  for split in mf.SPLITS:
    if not shards[split]:
      raise ValueError(
          f"--input={inputs}: the {split} split got no document ({stats.documents} documents "
          "read in all); " + ("the inputs are empty" if not stats.documents else
                              "change --val_fraction / --val_docs"))
  manifest = {
      "format": mf.FORMAT, "dtype": token_dtype.name, "tokenizer": spec.manifest_entry(),
      "splits": {split: {"shards": shards[split],
                         "num_tokens": sum(s["num_tokens"] for s in shards[split]),
                         "num_docs": sum(s["num_docs"] for s in shards[split])}
                 for split in mf.SPLITS},
      "num_docs": stats.documents, "sources": source_files, "settings": settings,
      "bad_utf8": {"policy": bad_utf8, "documents": stats.bad_utf8_documents},
      "skipped_documents": stats.skipped_documents,
  }
  path = os.path.join(output, mf.MANIFEST)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
  os.replace(path + ".tmp", path)
  for split in mf.SPLITS:  # the manifest now holds what the sidecars and the plan said
    for index in range(len(shards[split])):
      os.remove(os.path.join(output, shard_writer.sidecar_file(split, index)))
  os.remove(os.path.join(output, PLAN))
  if output != final_output:
    _replace(final_output, output)
  return manifest


if __name__ == "__main__":  # `python -m tfjax.data.prepare`: the command line, by module name
  runpy.run_module("tfjax.data.prepare_main", run_name="__main__", alter_sys=True)
