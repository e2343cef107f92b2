"""tfjax/nn/sections.py: a config section routes its flat model.* keys (its nested sections'
included) to its fields and back."""

import dataclasses
from typing import ClassVar, Optional

import pytest

from tfjax.nn.sections import Section


@dataclasses.dataclass(frozen=True)
class Inner(Section):
  depth: int = 1
  KEYS: ClassVar = {"inner_depth": "depth"}


@dataclasses.dataclass(frozen=True)
class Outer(Section):
  kind: str = "a"
  cap: Optional[float] = None
  inner: Inner = Inner()
  KEYS: ClassVar = {"outer_kind": "kind", "outer_cap": "cap"}
  NESTED: ClassVar = {"inner": Inner}
  OPTIONAL: ClassVar = {"outer_cap": float}


def test_flat_keys_route_to_fields_and_nested_sections():
  section = Outer.from_flat({"outer_kind": "b", "inner_depth": 3, "someone_elses_key": 0})
  assert section == Outer(kind="b", inner=Inner(depth=3))
  assert section.flat() == {"outer_kind": "b", "outer_cap": None, "inner_depth": 3}
  assert Outer.flat_keys() == ("outer_kind", "outer_cap", "inner_depth")
  assert Outer.flat_defaults() == {"outer_kind": "a", "outer_cap": None, "inner_depth": 1}
  assert Outer.optional_types() == {"outer_cap": float}
  assert Outer.from_flat(section.flat()) == section
  with pytest.raises(dataclasses.FrozenInstanceError):
    section.kind = "c"
