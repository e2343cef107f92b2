"""Rows of a prepared image or audio directory (tfjax-prepare --input=images:DIR / audio:DIR,
read by tfjax/data/prepared_media.py) in the order the loop's data contract asks for.

Training: row r of batch i is example `perm_e[p mod N]` of the train split, p = i * batch + r,
e = p div N the epoch and perm_e a permutation of the N examples drawn from (data.seed, e): every
epoch sees each example once, and the row is a pure function of (seed, i, r), so a resumed run
and any process split of the batch see the same rows (tfjax/data/datasets.py's contract).

Evaluation: the held-out split ('val', tfjax-prepare's --val_input) in one fixed order (a
permutation drawn from data.eval_seed: a folder's examples come sorted by class, and a batch of
one class would make in-batch metrics such as CLIP's retrieval meaningless), one group 'val';
batches cover min(N, eval_batches x eval_batch_size) examples of it, and the rows past its end
(the last batch's padding) repeat an example with weight 0, so they count nowhere. A config
meant to score the whole split sets train.eval_batches >= N / eval_batch_size.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from tfjax.data.prepared_media import MediaSplit, open_split

TRAIN_SPLIT, EVAL_SPLIT = "train", "val"


def open_prepared(config, kind: str, dataset_name: str) -> tuple[MediaSplit, MediaSplit]:
  """(train split, held-out split) of config.data.path, a prepared `kind` directory; one-line
  errors naming data.path for a missing path, a missing directory or another kind."""
  path = config.data.path
  if not path:
    raise ValueError(f"data.name={dataset_name!r} reads a prepared {kind} directory: set "
                     f"data.path=DIR (tfjax-prepare --input={kind.replace('image', 'images')}:"
                     "FOLDER --output=DIR; docs/data.md)")
  try:
    train = open_split(path, TRAIN_SPLIT, kind=kind, verify_mode=config.data.verify)
    held_out = open_split(path, EVAL_SPLIT, kind=kind, verify_mode="size")
  except FileNotFoundError as e:
    raise ValueError(str(e)) from None
  if not len(train):
    raise ValueError(f"data.path={path}: the train split holds no example")
  if not len(held_out):
    raise ValueError(f"data.path={path}: the held-out split is empty; prepare with "
                     "--val_input=FOLDER or --val_fraction")
  return train, held_out


class PreparedRows:
  """The loop's dataset over a prepared directory: `rows(split, indices, positions) -> dict of
  [n, ...] arrays` builds the examples (positions: each row's place in the training stream or in
  the held-out split, for choices a row makes beyond its example), `eval_rows` (default `rows`)
  the held-out ones; eval batches add `weights` [n] (0 on padding rows) unless
  `row_weights(weights_n, rows)` spreads them itself (per-token weights)."""

  def __init__(self, train: MediaSplit, held_out: MediaSplit, seed: int, eval_seed: int,
               rows: Callable[[MediaSplit, np.ndarray, np.ndarray], dict],
               eval_rows: Optional[Callable[[MediaSplit, np.ndarray, np.ndarray], dict]] = None,
               row_weights: Optional[Callable[[np.ndarray, dict], dict]] = None):
    self.train, self.held_out, self.seed = train, held_out, int(seed)
    self._rows, self._eval_rows = rows, eval_rows or rows
    self._row_weights = row_weights or (lambda w, rows: {**rows, "weights": w})
    self._perms: dict[int, np.ndarray] = {}
    self.eval_order = np.random.default_rng([int(eval_seed)]).permutation(len(held_out))

  def _train_index(self, position: int) -> int:
    epoch, k = divmod(position, len(self.train))
    if epoch not in self._perms:
      if len(self._perms) > 4:  # a run walks epochs in order: keep only recent ones
        self._perms.clear()
      self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
    return int(self._perms[epoch][k])

  def train_batch(self, index: int, batch_size: int, row_start: int = 0,
                  row_count: Optional[int] = None) -> dict:
    count = batch_size - row_start if row_count is None else row_count
    positions = index * batch_size + np.arange(row_start, row_start + count)
    indices = np.asarray([self._train_index(int(p)) for p in positions])
    return self._rows(self.train, indices, positions)

  def eval_batches(self, batch_size: int, num_batches: int, row_start: int = 0,
                   row_count: Optional[int] = None) -> list:
    count = batch_size - row_start if row_count is None else row_count
    total = len(self.held_out)
    out = []
    for b in range(min(num_batches, -(-total // batch_size))):
      positions = b * batch_size + np.arange(row_start, row_start + count)
      real = positions < total
      examples = self.eval_order[np.where(real, positions, 0)]
      rows = self._eval_rows(self.held_out, examples, positions)
      out.append(("val", self._row_weights(real.astype(np.float32), rows)))
    return out
