"""`Section`: a frozen dataclass of one block's config fields, each spelled by a flat model.* key.

Every block owns its fields (positions.py, rope_config.py, norms.py, attention.py, ffn.py) and
validates them next to its math; ModelConfig (tfjax/nn/config.py) composes the sections. Users
keep one flat spelling, `config.model.<key>` (`--config.model.rope_base=5e5`): `KEYS` maps each
flat key to the section's field, so a flat dict routes to its owners and back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict


@dataclasses.dataclass(frozen=True)
class Section:
  """Base of the per-block config sections.

  KEYS: flat model.* key -> field name; NESTED: field name -> the Section class it holds (its
  keys are flat keys of this section too); OPTIONAL: flat key -> type of a field whose default is
  None (a typed command-line placeholder, so `--config.model.window=256` parses).
  """
  KEYS: ClassVar[Dict[str, str]] = {}
  NESTED: ClassVar[Dict[str, type]] = {}
  OPTIONAL: ClassVar[Dict[str, type]] = {}

  @classmethod
  def flat_keys(cls) -> tuple:
    """Every flat key this section (and its nested sections) owns."""
    keys = tuple(cls.KEYS)
    for nested in cls.NESTED.values():
      keys += nested.flat_keys()
    return keys

  @classmethod
  def optional_types(cls) -> dict:
    types = dict(cls.OPTIONAL)
    for nested in cls.NESTED.values():
      types.update(nested.optional_types())
    return types

  @classmethod
  def from_flat(cls, items: Dict[str, Any]) -> "Section":
    """The section holding the flat keys of `items` it owns (defaults for the others)."""
    kwargs = {field: items[key] for key, field in cls.KEYS.items() if key in items}
    for field, nested in cls.NESTED.items():
      kwargs[field] = nested.from_flat(items)
    return cls(**kwargs)

  def flat(self) -> dict:
    """{flat key: value} of every field, nested sections included."""
    out = {key: getattr(self, field) for key, field in self.KEYS.items()}
    for field in self.NESTED:
      out.update(getattr(self, field).flat())
    return out

  @classmethod
  def flat_defaults(cls) -> dict:
    return cls().flat()

  def validate(self, model) -> None:
    """Raises a ValueError naming the flat key, the value and the fix; `model` is the composing
    ModelConfig (for constraints across sections)."""
    del model


class UnsupportedError(ValueError):
  """A checkpoint or config that tfjax cannot express exactly (named in the message).

  Raised by the sections' Hugging Face conversions (`from_hf`) and by tfjax/hf, which re-exports it.
  """
