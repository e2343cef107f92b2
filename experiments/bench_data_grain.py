"""grain and ArrayRecord against the prepared loader (experiments/bench_data.py --grain_batches).

The question (issue 33): would grain's DataLoader (worker processes, prefetch) or ArrayRecord's
random access feed 12 x 1024 batches faster than tfjax.data.prepared (pread from .npy shards
in the training process)? Both sides read the same prepared directory and draw the same rows.

1. Loaders, per mode (random windows, packed rows), `batches` global batches of ROWS x SEQ_LEN:
   - tfjax: PreparedDataset.train_batch(i) in a loop (what the training loop calls);
   - grain, one record per global batch: a RandomAccessDataSource whose record i is
     train_batch(i), under grain.python.DataLoader with each worker count (0: grain's reader
     threads and prefetch buffer in this process; N: N worker processes, each up to WORKER_BUFFER
     batches ahead). Record i stays batch i
     whatever the worker count, so the multi-host contract would survive;
   - grain, one record per row (grain's usual shape: rows batched by grain.python.Batch), worker
     count 0 only: with workers each one batches its own strided records, so batch i would no
     longer hold rows (i, 0..ROWS-1).
   Each grain batch is checked equal to tfjax's batch of the same index (first CHECKED and last).
   The first batch (worker start-up, first reads) is timed apart from the rest.
2. Random access: the train shards rewritten as ArrayRecord files (records of CHUNK tokens,
   group_size 1, uncompressed: its fastest random-access layout), then the same windows of
   SEQ_LEN + 1 tokens (the rows of the random-window batches) read by pread (TokenFile) and by
   ArrayRecordReader (the records a window spans, joined and sliced); windows checked equal to
   each other, and batch 1's to PreparedDataset.train_batch(1)'s rows.

Timings are the median over `repeats`; every repeat is kept in the JSON.
"""

from __future__ import annotations

import os
import time

import numpy as np

ROWS, SEQ_LEN = 12, 1024
CHUNK = 4096  # tokens per ArrayRecord record: 8 KB of uint16, a window spans at most 2 records
CHECKED = 8
# Batches each grain worker process may run ahead (grain's default is 1; 8 measured ~2x faster
# per batch here, so the comparison gives grain its better setting).
WORKER_BUFFER = 8


def available() -> str:
  """'' when grain and array_record import, else why not."""
  try:
    import grain.python  # pylint: disable=import-outside-toplevel,unused-import
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    return f"{e} (pip install 'tfjax[grain]')"
  return ""


def _dataset(directory: str, mode: str):
  from tfjax.data.prepared import PreparedDataset  # pylint: disable=import-outside-toplevel
  return PreparedDataset(directory, seq_len=SEQ_LEN, mode=mode, verify="size")


class BatchSource:
  """grain RandomAccessDataSource: record i = global training batch i. Pickles as its arguments
  (each worker process opens the directory itself)."""

  def __init__(self, directory: str, mode: str, num_batches: int):
    self.directory, self.mode, self.num_batches = directory, mode, num_batches
    self._ds = None

  def __len__(self) -> int:
    return self.num_batches

  def __getitem__(self, index: int) -> dict:
    if self._ds is None:
      self._ds = _dataset(self.directory, self.mode)
    return self._ds.train_batch(int(index), ROWS)

  def __getstate__(self):
    return {"directory": self.directory, "mode": self.mode, "num_batches": self.num_batches}

  def __setstate__(self, state):
    self.__init__(**state)


class RowSource(BatchSource):
  """grain RandomAccessDataSource: record k = row k % ROWS of global training batch k // ROWS."""

  def __len__(self) -> int:
    return self.num_batches * ROWS

  def __getitem__(self, index: int) -> dict:
    if self._ds is None:
      self._ds = _dataset(self.directory, self.mode)
    batch, row = divmod(int(index), ROWS)
    return {k: v[0] for k, v in self._ds.train_batch(batch, ROWS, row, 1).items()}


def _time_iterator(batches, count: int) -> tuple[float, float, list]:
  """(first batch s, batches 1..count-1 s, [(index, batch)] kept for the check). Stops after
  `count` batches without asking for another: the end of a grain iteration waits for its worker
  processes to finish, which is shutdown, not loading."""
  start = time.perf_counter()
  iterator = iter(batches)
  kept = [(0, next(iterator))]
  first = time.perf_counter() - start
  start = time.perf_counter()
  for index in range(1, count):
    batch = next(iterator)
    if index < CHECKED or index == count - 1:
      kept.append((index, batch))
  return first, time.perf_counter() - start, kept


def _grain_loader(source, *, workers: int, rows_per_record: bool):
  from absl import flags  # pylint: disable=import-outside-toplevel
  import grain.python as gp  # pylint: disable=import-outside-toplevel
  if not flags.FLAGS.is_parsed():  # grain reads its absl flags (defaults) outside an absl app
    flags.FLAGS.mark_as_parsed()
  operations = [gp.Batch(ROWS, drop_remainder=True)] if rows_per_record else []
  return gp.DataLoader(
      data_source=source, operations=operations, worker_count=workers,
      worker_buffer_size=WORKER_BUFFER,
      sampler=gp.IndexSampler(len(source), shard_options=gp.NoSharding(), shuffle=False,
                              num_epochs=1, seed=0))


def _ours(ds, num_batches: int):
  for index in range(num_batches):
    yield ds.train_batch(index, ROWS)


def _same(ds, kept: list) -> bool:
  for index, batch in kept:
    want = ds.train_batch(index, ROWS)
    if set(want) != set(batch) or not all(np.array_equal(want[k], batch[k]) for k in want):
      return False
  return True


def bench_loaders(directory: str, batches: int, repeats: int, workers: list[int]) -> list[dict]:
  """One row per (mode, loader): seconds for the first batch and tokens/s over the rest. Each
  repeat runs every loader once, so a change in the machine's load hits all of them alike;
  `vs_tfjax` pairs each repeat with tfjax's loader in the same repeat (its speed / tfjax's)."""
  variants = [("tfjax PreparedDataset.train_batch", None, False)]
  variants += [(f"grain DataLoader, record = batch, worker_count={w}", w, False) for w in workers]
  variants += [("grain DataLoader, record = row + grain Batch, worker_count=0", 0, True)]
  rows = []
  for mode in ("random", "packed"):
    ds = _dataset(directory, mode)
    runs = {name: {"first_batch_s": [], "rest_s": [], "same_batches": True}
            for name, _, _ in variants}
    for _ in range(repeats):
      for name, worker_count, rows_per_record in variants:
        if worker_count is None:
          loader = _ours(ds, batches + 1)
        else:
          source = (RowSource if rows_per_record else BatchSource)(directory, mode, batches + 1)
          loader = _grain_loader(source, workers=worker_count, rows_per_record=rows_per_record)
        first, rest, kept = _time_iterator(loader, batches + 1)
        del loader  # grain's worker processes stop here, outside the timing
        run = runs[name]
        run["same_batches"] = run["same_batches"] and _same(ds, kept)
        run["first_batch_s"].append(first)
        run["rest_s"].append(rest)
    ours = runs[variants[0][0]]["rest_s"]
    for name, run in runs.items():
      rest = float(np.median(run["rest_s"]))
      rows.append({"mode": mode, "loader": name, "batches": batches, "repeats": repeats, **run,
                   "ms_per_batch": 1e3 * rest / batches,
                   "tokens_per_s": batches * ROWS * SEQ_LEN / rest,
                   "vs_tfjax": [a / b for a, b in zip(ours, run["rest_s"])]})
  return rows


def write_array_record(directory: str, chunk: int = CHUNK) -> list[str]:
  """Each train shard's tokens as an ArrayRecord file of `chunk`-token records."""
  from array_record.python import array_record_module as arm  # pylint: disable=import-outside-toplevel
  from tfjax.data import manifest as mf  # pylint: disable=import-outside-toplevel
  paths = []
  for tokens, _ in mf.open_shards(directory, mf.read_manifest(directory), "train"):
    path = tokens.path.replace(".tokens.npy", ".arrayrecord")
    writer = arm.ArrayRecordWriter(path, "group_size:1,uncompressed")
    for start in range(0, len(tokens), chunk):
      writer.write(tokens[start:start + chunk].tobytes())
    writer.close()
    paths.append(path)
  return paths


def bench_random_access(directory: str, batches: int, repeats: int,
                        chunk: int = CHUNK) -> list[dict]:
  """The windows of `batches` random-window batches, read by pread and by ArrayRecordReader."""
  from array_record.python import array_record_module as arm  # pylint: disable=import-outside-toplevel
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  ds = _dataset(directory, "random")
  split = ds._splits["train"]  # pylint: disable=protected-access
  width = SEQ_LEN + 1
  split.windows(np.zeros(1, np.uint64), width)  # fills the per-shard window counts
  cumulative = split._windows_per_shard[width]  # pylint: disable=protected-access
  train_key = datasets._TRAIN  # pylint: disable=protected-access
  bits = np.concatenate([datasets.hash_bits(ds.seed, train_key, i, np.arange(ROWS))
                         for i in range(1, batches + 1)])  # the rows of batches 1..batches
  picks = datasets._randint(bits, int(cumulative[-1]))  # pylint: disable=protected-access
  shard_ids = np.searchsorted(cumulative, picks, side="right")
  starts = picks - np.concatenate([[0], cumulative])[shard_ids]
  readers = [arm.ArrayRecordReader(p, "readahead_buffer_size:0")
             for p in write_array_record(directory, chunk)]
  dtype = np.dtype(ds.manifest["dtype"])

  def pread_windows():
    return [np.asarray(split.tokens[s][i:i + width], np.int32) for s, i in zip(shard_ids, starts)]

  def array_record_windows():
    out = []
    for s, i in zip(shard_ids, starts):
      first, last = int(i) // chunk, (int(i) + width - 1) // chunk
      raw = b"".join(readers[s].read(first, last + 1))
      offset = int(i) - first * chunk
      out.append(np.frombuffer(raw, dtype)[offset:offset + width].astype(np.int32))
    return out

  readers_by_name = {"pread (tfjax TokenFile)": pread_windows,
                     f"ArrayRecordReader, {chunk}-token records": array_record_windows}
  seconds = {name: [] for name in readers_by_name}
  windows = {}
  for _ in range(repeats):  # alternating, so a change in the machine's load hits both alike
    for name, read in readers_by_name.items():
      start = time.perf_counter()
      windows[name] = read()
      seconds[name].append(time.perf_counter() - start)
  reference = np.stack(windows["pread (tfjax TokenFile)"])
  loader = ds.train_batch(1, ROWS)  # the first ROWS windows are batch 1's rows: inputs + 1 target
  from_loader = np.concatenate([loader["inputs"], loader["targets"][:, -1:]], axis=1)
  rows = []
  for name in readers_by_name:
    median = float(np.median(seconds[name]))
    rows.append({"reader": name, "windows": len(starts), "width": width, "repeats": repeats,
                 "seconds": seconds[name], "us_per_window": 1e6 * median / len(starts),
                 "tokens_per_s": len(starts) * SEQ_LEN / median,
                 "vs_pread": [a / b for a, b in zip(seconds["pread (tfjax TokenFile)"],
                                                    seconds[name])],
                 "same_windows": bool(np.array_equal(np.stack(windows[name]), reference)),
                 "batch_1_as_loader": bool(np.array_equal(np.stack(windows[name][:ROWS]),
                                                          from_loader))})
  for reader in readers:
    reader.close()
  return rows


def markdown(report: dict) -> list[str]:
  if "skipped" in report:
    return ["", f"grain comparison skipped: {report['skipped']}"]
  lines = ["", f"grain {report['versions']['grain']}, array_record "
           f"{report['versions']['array_record']}, {report['corpus_mb']} MB corpus, "
           f"median of {report['loaders'][0]['repeats']} repeats", "",
           "| mode | loader | first batch s | ms / 12x1024 batch | tokens/s | speed / tfjax "
           "(paired median) | same batches |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for row in report["loaders"]:
    lines.append(f"| {row['mode']} | {row['loader']} | {np.median(row['first_batch_s']):.3f} | "
                 f"{row['ms_per_batch']:.3f} | {row['tokens_per_s']:,.0f} | "
                 f"{np.median(row['vs_tfjax']):.2f} | {row['same_batches']} |")
  lines += ["", "| random access, windows of 1,025 tokens | us / window | tokens/s | "
            "speed / pread (paired median) | same windows |", "| --- | --- | --- | --- | --- |"]
  for row in report["random_access"]:
    lines.append(f"| {row['reader']} | {row['us_per_window']:.1f} | {row['tokens_per_s']:,.0f} | "
                 f"{np.median(row['vs_pread']):.2f} | "
                 f"{row['same_windows'] and row['batch_1_as_loader']} |")
  return lines
