"""Packing token documents into fixed-length rows with segment ids and positions, and the
next-token targets that never cross a document."""

from __future__ import annotations

import numpy as np



def pack_documents(docs: list, row_len: int) -> dict:
  """Greedily packs token arrays, in order, into rows of `row_len` tokens.

  Documents longer than a row are cut into row-sized pieces (each its own segment). Returns
  `tokens`, `segment_ids` (1, 2, ... within a row; 0 = padding) and `positions` (0-based within
  each segment), all int32 [num_rows, row_len].
  """
  pieces = [d[i:i + row_len] for d in docs for i in range(0, len(d), row_len)]
  rows, current, used = [], [], 0
  for piece in pieces:
    if used + len(piece) > row_len:
      rows.append(current)
      current, used = [], 0
    current.append(piece)
    used += len(piece)
  if current:
    rows.append(current)
  out = {k: np.zeros((len(rows), row_len), np.int32)
         for k in ("tokens", "segment_ids", "positions")}
  for r, row in enumerate(rows):
    start = 0
    for s, piece in enumerate(row, start=1):
      end = start + len(piece)
      out["tokens"][r, start:end] = piece
      out["segment_ids"][r, start:end] = s
      out["positions"][r, start:end] = np.arange(len(piece))
      start = end
  return out


def _packed_lm_targets(tokens, segment_ids):
  """Next token within the same segment; weight 0 at each segment's last token and padding."""
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, :-1] != 0)
  targets = np.zeros_like(tokens)
  weights = np.zeros(tokens.shape, np.float32)
  targets[:, :-1] = np.where(same, tokens[:, 1:], 0)
  weights[:, :-1] = same
  return targets, weights
