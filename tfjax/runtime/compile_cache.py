"""The persistent XLA compilation cache shared by the entry points (train, sweep, benchmarks).

Why: a run compiles its state init, train step, eval step and sampler from scratch, a large share
of a short run's time (docs/benchmarks/cpu_training.md). JAX keys each program
by its HLO, compile options, devices and JAX version, so a rerun, a resume, or a sweep point that
differs only in seed loads them instead. Values are never affected: a hit returns the same
executable.
"""

from __future__ import annotations

import logging
import os

from tfjax.runtime.files import cache_dir

OFF = "none"
_log = logging.getLogger(__name__)


def default_dir() -> str:
  """$TFJAX_CACHE_DIR/xla, else ~/.cache/tfjax/xla (next to the downloaded data)."""
  return os.path.join(cache_dir(), "xla")


def enable(directory: str) -> str | None:
  """Points JAX's persistent cache at `directory` ('' = default_dir(), 'none' = leave it off).
  Every program is cached, however fast it compiled. Returns the directory used, or None."""
  if directory == OFF:
    return None
  directory = os.path.abspath(os.path.expanduser(directory or default_dir()))
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:  # an optimization only: say so, and run without it
    _log.warning("compilation cache disabled: cannot create %s (%s); pass "
                 "--compilation_cache=DIR or none", directory, e)
    return None
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory
