"""ListOps (Nangia & Bowman 2018) as the Long Range Arena generates it (Tay et al. 2021, sec. 2.2).

An example is one nested prefix expression over the digits 0-9, e.g. `[MAX 4 3 [MIN 2 3 ] 1 0 ]`
(value 4), and its label is the expression's value, one of 10 classes. Operators, as in LRA:
  [MAX, [MIN   the largest / smallest argument
  [MED         the median, rounded down (an even count averages the middle two, then floors)
  [SM          the sum modulo 10
Each operator takes 2 to MAX_ARGS arguments and is closed by `]`. Tokens (`SYMBOLS`, one id
each): the ten digits, the four operators and `]`; LRA's brackets `(` `)` are tree-printing
artefacts its input pipeline deletes, so they are not tokens here either.

The tree, as LRA's generator describes it: a node at depth < MAX_DEPTH (the root has depth 1) is an
operator with probability OPERATOR_P, else a uniform digit; a node at MAX_DEPTH is a digit; an
operator draws its argument count uniformly from [2, MAX_ARGS] and its operator uniformly. Trees
are drawn until their token count lies in [min_len, max_len] (LRA: 500 to 2000; here min_len
defaults to max_len // 4, LRA's ratio). A draw stops as soon as it passes max_len: it would be
rejected anyway, so the accepted trees are distributed as in LRA while long draws cost nothing.

Determinism: `generate(rng, ...)` uses only `rng` (a numpy Generator), so an example is a pure
function of the generator's seed (tfjax.data.synthetic seeds one per row).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

DIGITS = tuple(str(d) for d in range(10))
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
CLOSE = "]"
SYMBOLS = DIGITS + OPERATORS + (CLOSE,)  # token id i (before any special-token offset)
NUM_CLASSES = 10
MAX_DEPTH = 10
MAX_ARGS = 10
OPERATOR_P = 0.25  # LRA's VALUE_P: a node below MAX_DEPTH is a digit with probability 0.75
MAX_TRIES = 100_000  # rejection draws per example before giving up (see generate)

_OP_ID = {name: SYMBOLS.index(name) for name in OPERATORS}
_CLOSE_ID = SYMBOLS.index(CLOSE)


class _TooLong(Exception):
  """A draw passed max_len: rejected without finishing the tree."""


def apply_operator(op: str, args) -> int:
  """The value of operator `op` (one of OPERATORS) over the digit list `args`."""
  if op == "[MAX":
    return max(args)
  if op == "[MIN":
    return min(args)
  if op == "[MED":
    ordered, n = sorted(args), len(args)
    # Both middle values are non-negative, so floor division is LRA's int(np.median(...)).
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) // 2
  if op == "[SM":
    return sum(args) % 10
  raise ValueError(f"unknown ListOps operator {op!r}; one of {OPERATORS}")


class _Uniforms:
  """Uniform [0, 1) draws of `rng`, fetched in blocks: one NumPy call per block instead of one
  per tree node halves generation time (CPU-2, max_len 512: ~1.5 ms per example, ~3.6 ms node
  by node)."""

  def __init__(self, rng: np.random.Generator, block: int = 1024):
    self.rng, self.block, self.buf, self.i = rng, block, rng.random(block), 0

  def next(self) -> float:
    if self.i == self.block:
      self.buf, self.i = self.rng.random(self.block), 0
    self.i += 1
    return self.buf[self.i - 1]

  def below(self, n: int) -> int:
    """A uniform integer in [0, n)."""
    return min(int(self.next() * n), n - 1)


def _draw(u: _Uniforms, depth: int, tokens: list, max_len: int, max_depth: int,
          max_args: int) -> int:
  """Appends one subtree's token ids to `tokens` and returns its value."""
  if depth < max_depth and u.next() < OPERATOR_P:
    op = OPERATORS[u.below(len(OPERATORS))]
    n_args = 2 + u.below(max_args - 1)
    tokens.append(_OP_ID[op])
    args = [_draw(u, depth + 1, tokens, max_len, max_depth, max_args) for _ in range(n_args)]
    tokens.append(_CLOSE_ID)
    if len(tokens) > max_len:
      raise _TooLong
    return apply_operator(op, args)
  digit = u.below(10)
  tokens.append(digit)
  if len(tokens) > max_len:
    raise _TooLong
  return digit


def generate(rng: np.random.Generator, max_len: int, min_len: Optional[int] = None,
             max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS) -> tuple[np.ndarray, int]:
  """(token ids [n] int32 with min_len <= n <= max_len, label in [0, 10)): one ListOps example."""
  min_len = max(1, max_len // 4) if min_len is None else min_len
  if not 1 <= min_len <= max_len:
    raise ValueError(f"ListOps lengths need 1 <= min_len <= max_len, got min_len={min_len}, "
                     f"max_len={max_len}")
  if max_depth < 1 or max_args < 2:
    raise ValueError(f"ListOps needs max_depth >= 1 and max_args >= 2, got {max_depth}, "
                     f"{max_args}")
  u = _Uniforms(rng)
  for _ in range(MAX_TRIES):
    tokens: list = []
    try:
      value = _draw(u, 1, tokens, max_len, max_depth, max_args)
    except _TooLong:
      continue
    if len(tokens) >= min_len:
      return np.asarray(tokens, np.int32), value
  raise ValueError(f"no ListOps tree of {min_len}-{max_len} tokens in {MAX_TRIES} draws "
                   f"(max_depth={max_depth}, max_args={max_args}); widen the length range")


def to_text(token_ids) -> str:
  """Token ids -> the expression as text, e.g. '[MAX 4 3 [MIN 2 3 ] 1 0 ]'."""
  return " ".join(SYMBOLS[int(i)] for i in token_ids)
