"""A process-wide cache for pure, costly values that sweep config modules compute (e.g. the rows
a data-derived floor is fitted on). tfjax.research.sweep.load_module executes a config file anew
at each load, so a cache inside the module (functools.lru_cache) lasts one load only; the page
rebuild (tfjax/research/sweep_doc.py) loads every section config several times."""

from typing import Any, Callable, Hashable

_VALUES: dict = {}


def cached(key: Hashable, compute: Callable[[], Any]) -> Any:
  """compute() once per key and process. Only for values that depend on nothing but the key."""
  if key not in _VALUES:
    _VALUES[key] = compute()
  return _VALUES[key]
