"""Naming the leaves of a pytree: the one helper behind weight-decay masks, sharding lookups and
checkpoint comparisons."""

from __future__ import annotations

import jax


def path_names(path, dict_keys_only: bool = False) -> tuple[str, ...]:
  """The entries of a `jax.tree_util` key path as strings: dict keys, attribute names (dataclass
  fields, a box's `.value`) and sequence indices alike, so a train state, its checkpoint metadata
  and a params tree name the same leaf the same way.

  `dict_keys_only`: keep only dict keys, i.e. a parameter's name in a (possibly boxed) params
  tree, without the trailing `.value` of an `nn.LogicallyPartitioned` box."""
  if dict_keys_only:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
  return tuple(_entry_name(k) for k in path)


def _entry_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)
