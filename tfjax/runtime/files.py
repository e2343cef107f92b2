"""Small file helpers shared by the data, training and research code, and the cache folder.

Writes are write-then-rename: a reader (another process of a multi-host run, a sweep's status
command, a resumed run) never sees half a file, and a crash mid-write leaves the old file intact.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Iterator

CACHE_DIR_ENV = "TFJAX_CACHE_DIR"


def cache_dir() -> str:
  """$TFJAX_CACHE_DIR, else ~/.cache/tfjax: downloaded data and the XLA compilation cache."""
  return os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tfjax")


@contextlib.contextmanager
def replaced_atomically(path: str, mode: str = "w") -> Iterator[IO]:
  """An open file whose contents replace `path` when the block ends without an error (text modes
  write UTF-8). On an error the temporary file is removed and `path` is left as it was."""
  tmp = f"{path}.tmp{os.getpid()}"
  encoding = None if "b" in mode else "utf-8"
  try:
    with open(tmp, mode, encoding=encoding) as f:
      yield f
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  os.replace(tmp, path)


def write_json_atomic(path: str, obj, **dump_kwargs) -> None:
  """Writes `obj` as JSON to `path` atomically; `dump_kwargs` go to `json.dump`."""
  with replaced_atomically(path) as f:
    json.dump(obj, f, **dump_kwargs)


def read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)
