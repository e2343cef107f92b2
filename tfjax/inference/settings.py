"""What a generation is compiled for (`Plan`, static) and what it is passed as traced values
(`Knobs`), shared by the sampling and beam loops."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax


@dataclasses.dataclass(frozen=True)
class Plan:
  """What shapes the compiled program (jit recompiles when it changes)."""
  strategy: str
  max_new_tokens: int
  num_samples: int
  beam_size: int
  top_k: Optional[int]
  use_top_p: bool
  slide: bool = False  # decode_window 'slide': re-run the last max_len tokens once past max_len


class Knobs(NamedTuple):
  """Scalars passed as traced values, so changing them reuses the compiled program."""
  temperature: jax.Array
  top_p: jax.Array
  length_penalty: jax.Array
  eos_id: jax.Array  # -1 = no EOS
  pad_id: jax.Array
