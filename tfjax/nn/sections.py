"""`Section`: a frozen dataclass of one block's config fields, each spelled by a flat model.* key.

Every block owns its fields (positions.py, rope_config.py, norms.py, attention.py, ffn.py) and
validates them next to its math; ModelConfig (tfjax/nn/config.py) composes the sections. Users
keep one flat spelling, `config.model.<key>` (`--config.model.rope_base=5e5`), and the library
reads the field (`cfg.positions.rope.base`). A field is declared once, as a dataclass field: its
flat key is the field name unless `flat_key(...)` names another (`internal(...)`: no key), its
default the field's, its command-line type the X of an `Optional[X]` annotation, and a field
annotated with a Section class nests that section (its keys are flat keys of this one too).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Dict, NamedTuple, Optional, Tuple

_FLAT = "flat_key"  # dataclasses.field metadata: the field's flat key (None: not a config key)


def flat_key(key: str, default: Any) -> Any:
  """A field spelled `model.<key>` in config.model (not its field name), default `default`."""
  return dataclasses.field(default=default, metadata={_FLAT: key})


def internal(default: Any) -> Any:
  """A field set by the library, not by config.model (no flat key)."""
  return dataclasses.field(default=default, metadata={_FLAT: None})


class FlatField(NamedTuple):
  key: str             # the flat model.* key
  path: Tuple[str, ...]  # field names from the outermost section to the field
  optional: Optional[type]  # X of an Optional[X] annotation (a typed None placeholder), else None


@functools.lru_cache(maxsize=None)
def _layout(cls) -> Tuple[Tuple[FlatField, ...], Tuple[Tuple[str, type], ...]]:
  """(the flat fields of `cls`'s own fields, (field name, Section class) of its nested ones)."""
  stale = [name for name in ("KEYS", "OPTIONAL", "NESTED") if hasattr(cls, name)]
  if stale:  # the tables this module replaced: a key there would be silently ignored
    raise TypeError(f"{cls.__name__} declares {stale}; declare each flat key on its field "
                    "instead (`bias: bool = flat_key('attention_bias', True)`)")
  hints = typing.get_type_hints(cls)
  own, nested = [], []
  for field in dataclasses.fields(cls):
    hint = hints[field.name]
    if isinstance(hint, type) and issubclass(hint, Section):
      nested.append((field.name, hint))
      continue
    key = field.metadata.get(_FLAT, field.name)
    if key is not None:
      own.append(FlatField(key, (field.name,), _optional_type(hint)))
  return tuple(own), tuple(nested)


def _optional_type(hint) -> Optional[type]:
  if typing.get_origin(hint) not in (typing.Union, types.UnionType):
    return None
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  return args[0] if len(args) == 1 and len(typing.get_args(hint)) == 2 else None


@dataclasses.dataclass(frozen=True)
class Section:
  """Base of the per-block config sections (and of ModelConfig, which nests them)."""

  @classmethod
  def flat_fields(cls) -> Tuple[FlatField, ...]:
    """Every flat field this section (and its nested sections) owns, in declaration order."""
    own, nested = _layout(cls)
    out = own
    for name, section in nested:
      out += tuple(f._replace(path=(name,) + f.path) for f in section.flat_fields())
    return out

  @classmethod
  def nested_sections(cls) -> Tuple[Tuple[str, type], ...]:
    """(field name, Section class) of the sections this one nests."""
    return _layout(cls)[1]

  @classmethod
  def flat_keys(cls) -> tuple:
    """Every flat key this section (and its nested sections) owns."""
    return tuple(f.key for f in cls.flat_fields())

  @classmethod
  def optional_types(cls) -> dict:
    """{flat key: X} of the fields annotated Optional[X] (default None)."""
    return {f.key: f.optional for f in cls.flat_fields() if f.optional is not None}

  @classmethod
  def from_flat(cls, items: Dict[str, Any]) -> "Section":
    """The section holding the flat keys of `items` it owns (defaults for the others)."""
    own, nested = _layout(cls)
    kwargs = {f.path[0]: items[f.key] for f in own if f.key in items}
    for name, section in nested:
      kwargs[name] = section.from_flat(items)
    return cls(**kwargs)

  def flat(self) -> dict:
    """{flat key: value} of every field, nested sections included."""
    own, nested = _layout(type(self))
    out = {f.key: getattr(self, f.path[0]) for f in own}
    for name, _ in nested:
      out.update(getattr(self, name).flat())
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
