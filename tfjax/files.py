"""Small file helpers shared by the training system and the research tools.

Writes are write-then-rename: a reader (another process of a multi-host run, a sweep's status
command, a resumed run) never sees half a file, and a crash mid-write leaves the old file intact.
"""

from __future__ import annotations

import json
import os


def write_json_atomic(path: str, obj, **dump_kwargs) -> None:
  """Writes `obj` as JSON to `path` atomically; `dump_kwargs` go to `json.dump`."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, **dump_kwargs)
  os.replace(tmp, path)


def read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)
