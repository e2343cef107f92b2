"""Documents out of local corpus files, streamed: nothing holds more than one document (or one
Parquet / Arrow record batch) in memory.

Inputs: `.txt` (a document per paragraph, paragraphs separated by blank lines; or the whole file
with txt_docs='file'), `.jsonl` / `.jsonl.gz` / `.jsonl.zst` (a document per line, its text in
`text_field`), `.parquet` (a document per row of column `text_field`), and a directory written by
`datasets`' save_to_disk (its Arrow files, same column). Files are read in the order given, a
glob's matches sorted, so the document stream is the same on every run.

Bytes that are not UTF-8: `bad_utf8='replace'` (U+FFFD; the default), 'skip' (drop the document)
or 'error'; `Stats` counts the documents affected either way.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import re
from typing import Iterator

BAD_UTF8 = ("replace", "skip", "error")
TXT_DOCS = ("paragraphs", "file")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
FILE_SUFFIXES = (".txt",) + JSONL_SUFFIXES + (".parquet",)
HF_DATASET_MARKER = "state.json"  # what datasets' save_to_disk writes next to its Arrow files


@dataclasses.dataclass
class Stats:
  documents: int = 0
  bad_utf8_documents: int = 0  # documents with bytes that are not UTF-8 (replaced or skipped)
  skipped_documents: int = 0  # bad_utf8='skip' drops, plus empty documents
  bytes_read: int = 0


def resolve_inputs(spec: str) -> list[str]:
  """Comma-separated files, globs or one save_to_disk directory -> the ordered list of inputs."""
  paths = []
  for part in [p.strip() for p in spec.split(",") if p.strip()]:
    matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
    if not matches:
      raise FileNotFoundError(f"--input={part!r}: the pattern matches no file")
    for path in matches:
      if not os.path.exists(path):
        raise FileNotFoundError(f"--input={path!r}: no such file or directory")
      if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, HF_DATASET_MARKER)):
          raise ValueError(f"--input={path!r} is a directory but not a `datasets` save_to_disk "
                           f"one (no {HF_DATASET_MARKER}); give its files, e.g. '{path}/*.jsonl'")
      elif not path.endswith(FILE_SUFFIXES):
        raise ValueError(f"--input={path!r}: unknown file type; give {', '.join(FILE_SUFFIXES)} "
                         "files or a save_to_disk directory")
      paths.append(path)
  if not paths:
    raise ValueError("--input is empty: give the corpus files (comma-separated, globs allowed)")
  return paths


def source_info(path: str) -> list[dict]:
  """[{'path', 'bytes', 'mtime'}] of the files behind an input (a directory: each of its files)."""
  names = ([os.path.join(path, n) for n in sorted(os.listdir(path))] if os.path.isdir(path)
           else [path])
  return [{"path": os.path.abspath(n), "bytes": os.path.getsize(n),
           "mtime": os.path.getmtime(n)} for n in names if os.path.isfile(n)]


def _decode(raw: bytes, where: str, bad_utf8: str, stats: Stats):
  """str of `raw`, or None for a document to skip."""
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    stats.bad_utf8_documents += 1
    if bad_utf8 == "error":
      raise ValueError(f"{where}: bytes that are not UTF-8 ({e.reason} at byte {e.start}); pass "
                       "--bad_utf8=replace or --bad_utf8=skip to go on") from None
    if bad_utf8 == "skip":
      stats.skipped_documents += 1
      return None
    return raw.decode("utf-8", errors="replace")


def _open_binary(path: str):
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  if path.endswith(".zst"):
    try:
      import zstandard  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ValueError(f"{path}: reading .zst needs the `zstandard` package: "
                       "pip install 'tfjax[data]'") from None
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
  return open(path, "rb")


_BLANK = re.compile(rb"^\s*$")


def _txt_documents(path, txt_docs, bad_utf8, stats):
  with open(path, "rb") as f:
    if txt_docs == "file":
      raw = f.read()
      stats.bytes_read += len(raw)
      yield _decode(raw, path, bad_utf8, stats)
      return
    lines, first_line = [], 1
    for number, line in enumerate(f, start=1):
      stats.bytes_read += len(line)
      if _BLANK.match(line):
        if lines:
          yield _decode(b"".join(lines).rstrip(b"\n"), f"{path}:{first_line}", bad_utf8, stats)
          lines = []
        first_line = number + 1
      else:
        lines.append(line)
    if lines:
      yield _decode(b"".join(lines).rstrip(b"\n"), f"{path}:{first_line}", bad_utf8, stats)


def _jsonl_documents(path, text_field, bad_utf8, stats):
  with _open_binary(path) as f:
    for number, line in enumerate(f, start=1):
      # Uncompressed bytes: the bar (over file sizes) is approximate for .gz/.zst.
      stats.bytes_read += len(line)
      if not line.strip():
        continue
      where = f"{path}:{number}"
      text = _decode(line, where, bad_utf8, stats)
      if text is None:
        continue
      try:
        record = json.loads(text)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object ({e.msg}); every line of a .jsonl file is "
                         "one JSON document") from None
      if not isinstance(record, dict) or text_field not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: no {text_field!r} field (it has {keys}); name the text field "
                         "with --text_field=KEY")
      if not isinstance(record[text_field], str):
        raise ValueError(f"{where}: field {text_field!r} is a {type(record[text_field]).__name__}"
                         ", not text")
      yield record[text_field]


def _arrow_column(table_batches, where, text_field, stats):
  for batch in table_batches:
    if text_field not in batch.schema.names:
      raise ValueError(f"{where}: no column {text_field!r} (it has {batch.schema.names}); name "
                       "the text column with --text_field=KEY")
    for text in batch.column(text_field).to_pylist():
      stats.bytes_read += len(text.encode("utf-8")) if text else 0
      yield text


def _import_pyarrow(path):
  try:
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.ipc  # pylint: disable=import-outside-toplevel,unused-import
    import pyarrow.parquet  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ValueError(f"{path}: reading Parquet / Arrow needs `pyarrow`: "
                     "pip install 'tfjax[data]'") from None
  return pyarrow


def _parquet_documents(path, text_field, stats):
  pa = _import_pyarrow(path)
  yield from _arrow_column(pa.parquet.ParquetFile(path).iter_batches(), path, text_field, stats)


def _hf_dataset_documents(path, text_field, stats):
  pa = _import_pyarrow(path)
  with open(os.path.join(path, HF_DATASET_MARKER), encoding="utf-8") as f:
    data_files = [d["filename"] for d in json.load(f).get("_data_files", [])]
  if not data_files:
    raise ValueError(f"{path}: its {HF_DATASET_MARKER} lists no data files")
  for name in data_files:
    with pa.memory_map(os.path.join(path, name)) as source:
      yield from _arrow_column(pa.ipc.open_stream(source), os.path.join(path, name), text_field,
                               stats)


def documents(paths: list[str], *, text_field: str = "text", txt_docs: str = "paragraphs",
              bad_utf8: str = "replace", stats: Stats | None = None) -> Iterator[str]:
  """Every non-empty document of `paths`, in order (see the module docstring)."""
  if bad_utf8 not in BAD_UTF8:
    raise ValueError(f"--bad_utf8={bad_utf8!r}: choose one of {', '.join(BAD_UTF8)}")
  if txt_docs not in TXT_DOCS:
    raise ValueError(f"--txt_docs={txt_docs!r}: choose one of {', '.join(TXT_DOCS)}")
  stats = Stats() if stats is None else stats
  for path in paths:
    if os.path.isdir(path):
      stream = _hf_dataset_documents(path, text_field, stats)
    elif path.endswith(".txt"):
      stream = _txt_documents(path, txt_docs, bad_utf8, stats)
    elif path.endswith(".parquet"):
      stream = _parquet_documents(path, text_field, stats)
    else:
      stream = _jsonl_documents(path, text_field, bad_utf8, stats)
    for text in stream:
      if text is None:
        continue
      if not text:
        stats.skipped_documents += 1
        continue
      stats.documents += 1
      yield text
