"""A checkpoint step's manifest: every file of the step with its size and CRC-32C, so a restore can
tell a good step from one with a missing, cut-short or corrupted file before reading it.

Why: orbax renames a step into place only once it is complete, but it never checks the bytes it
reads back. A flipped bit in an array file restores without complaint and shows up later as a
NaN loss (or not at all), and a lost `_METADATA` reads as "a different model". The manifest is
written last, atomically (write then rename), once orbax has finalized the step; `verify` reads
every file back and compares. CRC-32C (google-crc32c, the CPU's CRC instruction) runs on a
thread pool without the GIL, and the restore computes the checksums beside orbax's read of the
same files (Checkpointer.restore_latest). What it adds to a restore, against zlib's CRC-32:
docs/benchmarks/checkpoints.md, "Checkpoint verification".

A step without a manifest was written by an older tfjax, or the process died between orbax's
rename and the manifest: its files are complete (orbax's rename is atomic) but unverified, so
`verify` only checks that the files orbax cannot restore without are there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os

import google_crc32c

from tfjax.runtime import files

if google_crc32c.implementation != "c":  # the pure-Python fallback is ~1000x slower
  logging.getLogger(__name__).warning(
      "google-crc32c has no compiled extension here: checkpoint checksums will be slow")

MANIFEST = "tfjax_manifest.json"
# Files orbax needs to restore the train state: checked even for a step without a manifest.
REQUIRED = ("state/_METADATA", "_CHECKPOINT_METADATA")
_CHUNK = 8 << 20


def _crc32c(path: str) -> int:
  """The file's CRC-32C, read in 8 MiB chunks (google-crc32c takes bytes only)."""
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      crc = google_crc32c.extend(crc, chunk)
  return crc


def _relative_files(step_dir: str) -> list[str]:
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != MANIFEST and not rel.startswith(f"{MANIFEST}.tmp"):
        out.append(rel)
  return sorted(out)


def _checksums(step_dir: str, rel_paths: list[str]) -> list[int]:
  with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(lambda rel: _crc32c(os.path.join(step_dir, rel)), rel_paths))


def write(step_dir: str) -> None:
  """Writes `step_dir`'s manifest (sizes and CRC-32C of every file in it) atomically."""
  rels = _relative_files(step_dir)
  entries = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)), "crc32c": crc}
             for rel, crc in zip(rels, _checksums(step_dir, rels))}
  files.write_json_atomic(os.path.join(step_dir, MANIFEST), {"version": 1, "files": entries},
                          indent=0, sort_keys=True)


def has_manifest(step_dir: str) -> bool:
  return os.path.exists(os.path.join(step_dir, MANIFEST))


def read_entries(step_dir: str) -> dict:
  """{relative path: {"size", "crc32c"}} of `step_dir`'s manifest."""
  return files.read_json(os.path.join(step_dir, MANIFEST))["files"]


def verify(step_dir: str, checksums: bool = True) -> str:
  """'' if `step_dir` is whole (every file of its manifest there, with its size and CRC-32C; or,
  without a manifest, the files orbax needs there); else one phrase naming the first fault.
  checksums=False checks only presence and sizes (no file is read: instant);
  `verify_checksums` does the rest, e.g. on a thread while the step is read."""
  missing = [rel for rel in REQUIRED if not os.path.exists(os.path.join(step_dir, rel))]
  if missing:
    return f"{missing[0]} is missing"
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    return ""
  try:
    entries = read_entries(step_dir)
  except (ValueError, KeyError, TypeError) as e:
    return f"its manifest {MANIFEST} is unreadable ({type(e).__name__})"
  for rel, want in sorted(entries.items()):
    full = os.path.join(step_dir, rel)
    if not os.path.exists(full):
      return f"{rel} is missing"
    size = os.path.getsize(full)
    if size != want["size"]:
      return f"{rel} has {size} bytes, the manifest says {want['size']}"
  return verify_checksums(step_dir) if checksums else ""


def verify_checksums(step_dir: str) -> str:
  """'' if every file of `step_dir`'s manifest has its CRC-32C (or there is no manifest), else
  the first file that does not. Reads every file."""
  if not has_manifest(step_dir):
    return ""
  try:
    entries = read_entries(step_dir)
  except (ValueError, KeyError, TypeError) as e:
    return f"its manifest {MANIFEST} is unreadable ({type(e).__name__})"
  rels = sorted(entries)
  try:
    crcs = _checksums(step_dir, rels)
  except OSError as e:
    return f"a file is unreadable ({e})"
  for rel, crc in zip(rels, crcs):
    if crc != entries[rel]["crc32c"]:
      return f"{rel} fails its checksum (corrupted bytes)"
  return ""
