"""tfjax/nn/sections.py: a config section's fields declare their flat model.* keys (field name or
`flat_key`), defaults and Optional types once; the section routes flat keys (its nested sections'
included) to its fields and back."""

from __future__ import annotations  # annotations are strings, as in the library's modules

import dataclasses
from typing import Optional

import pytest

from tfjax.nn.sections import Section, flat_key, internal


@dataclasses.dataclass(frozen=True)
class Inner(Section):
  depth: int = flat_key("inner_depth", 1)


@dataclasses.dataclass(frozen=True)
class Outer(Section):
  kind: str = flat_key("outer_kind", "a")
  cap: Optional[float] = flat_key("outer_cap", None)
  width: int | None = None  # keyed by its field name; PEP 604 spelling of Optional[int]
  gain: float = internal(1.0)  # set by the library, no flat key
  inner: Inner = Inner()


def test_flat_keys_route_to_fields_and_nested_sections():
  section = Outer.from_flat({"outer_kind": "b", "inner_depth": 3, "someone_elses_key": 0})
  assert section == Outer(kind="b", inner=Inner(depth=3))
  assert section.flat() == {"outer_kind": "b", "outer_cap": None, "width": None, "inner_depth": 3}
  assert Outer.flat_keys() == ("outer_kind", "outer_cap", "width", "inner_depth")
  assert [f.path for f in Outer.flat_fields()] == [("kind",), ("cap",), ("width",),
                                                   ("inner", "depth")]
  assert Outer.flat_defaults() == {"outer_kind": "a", "outer_cap": None, "width": None,
                                   "inner_depth": 1}
  assert Outer.optional_types() == {"outer_cap": float, "width": int}
  assert Outer.nested_sections() == (("inner", Inner),)
  assert Outer.from_flat(section.flat()) == section
  assert Outer.from_flat({"gain": 2.0}).gain == 1.0  # an internal field is no flat key
  with pytest.raises(dataclasses.FrozenInstanceError):
    section.kind = "c"


def test_a_keys_table_is_refused_naming_the_field_declaration():
  @dataclasses.dataclass(frozen=True)
  class Stale(Section):
    bias: bool = True
    KEYS = {"stale_bias": "bias"}

  with pytest.raises(TypeError, match=r"Stale declares \['KEYS'\]; declare each flat key on its "
                                      r"field instead"):
    Stale.flat_keys()
