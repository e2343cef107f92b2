"""Where text corpora come from: Tiny Shakespeare ($TFJAX_DATA_DIR, else a cached download) and
any UTF-8 file, read whole and split into train / validation by characters."""

from __future__ import annotations

import os
import urllib.request

from tfjax.runtime import files
from tfjax.runtime.files import CACHE_DIR_ENV, cache_dir

DATA_DIR_ENV = "TFJAX_DATA_DIR"
TINYSHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt")



def _download(url: str, dest: str) -> None:
  """Fetches url into dest (write-then-rename, so concurrent processes never see half a file).
  The folder is made only once the download has arrived: a failed one leaves nothing behind."""
  with urllib.request.urlopen(url, timeout=60) as response:
    data = response.read()
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  with files.replaced_atomically(dest, "wb") as f:
    f.write(data)


def tinyshakespeare_path() -> str:
  """$TFJAX_DATA_DIR/tinyshakespeare/input.txt if present, else the cached copy (fetched once)."""
  rel = os.path.join("tinyshakespeare", "input.txt")
  data_dir = os.environ.get(DATA_DIR_ENV)
  if data_dir and os.path.exists(os.path.join(data_dir, rel)):
    return os.path.join(data_dir, rel)
  cached = os.path.join(cache_dir(), rel)
  if os.path.exists(cached):
    return cached
  try:
    _download(TINYSHAKESPEARE_URL, cached)
  except Exception as e:  # any network / filesystem failure gets the same actionable message
    where = os.path.join(data_dir, rel) if data_dir else f"${DATA_DIR_ENV}/{rel}"
    raise FileNotFoundError(
        f"Tiny Shakespeare not found and the download from {TINYSHAKESPEARE_URL} failed ({e!r}). "
        f"Put the file at {where} (set {DATA_DIR_ENV} to the folder holding tinyshakespeare/), "
        f"or at {cached} (the cache: ${CACHE_DIR_ENV} or ~/.cache/tfjax)") from e
  return cached


def read_text(path: str) -> str:
  if not os.path.exists(path):
    raise FileNotFoundError(f"data.path={path!r}: no such text file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if not text:
    raise ValueError(f"text file {path} is empty (0 characters)")
  return text


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
  """First (1 - val_fraction) of the characters for training, the rest for validation."""
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
  cut = int(len(text) * (1.0 - val_fraction))
  return text[:cut], text[cut:]
