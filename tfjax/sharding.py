"""Device mesh and logical-axis sharding rules: the one place that knows about devices.

Every parameter is created with logical axis names (`nn.with_logical_partitioning`) and activations
carry `nn.with_logical_constraint`; `config.sharding_rules` maps those names onto the mesh axes
('data', 'fsdp', 'tensor'). The defaults give data parallelism over data x fsdp, ZeRO-3 style
parameter/optimizer sharding over fsdp, and Megatron-style tensor parallelism (heads and mlp split)
over tensor; any mix follows from the mesh shape alone.
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with at most one -1 filled by the remaining devices."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if any(s == 0 or s < -1 for s in sizes) or num_devices % known:
    raise ValueError(
        f"config.mesh {dict(zip(MESH_AXES, sizes))} does not divide the {num_devices} available "
        "devices; the product of the axes must equal the device count (use -1 for one axis)")
  sizes = [num_devices // known if s == -1 else s for s in sizes]
  if int(np.prod(sizes)) != num_devices:
    raise ValueError(
        f"config.mesh {dict(zip(MESH_AXES, sizes))} uses {int(np.prod(sizes))} devices but "
        f"{num_devices} are available; make the product match or set one axis to -1")
  return tuple(sizes)


def make_mesh(mesh_config, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def rules(config) -> tuple:
  custom = config.get("sharding_rules", None) if hasattr(config, "get") else None
  return tuple(tuple(r) for r in custom) if custom else DEFAULT_RULES


@contextlib.contextmanager
def axis_rules(mesh: Mesh, logical_rules):
  """Activates the mesh and rules so nn.with_logical_constraint resolves inside jit."""
  with mesh, nn.logical_axis_rules(logical_rules):
    yield


def logical_shardings(mesh: Mesh, boxed_tree, logical_rules):
  """NamedShardings for a tree whose leaves may be nn.LogicallyPartitioned boxes."""
  specs = nn.get_partition_spec(boxed_tree)
  mesh_specs = nn.logical_to_mesh(specs, logical_rules)
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), mesh_specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh, logical_rules) -> NamedSharding:
  """Leading (batch) axis split over the data-parallel mesh axes, the rest replicated."""
  spec = nn.logical_to_mesh_axes(("batch",), logical_rules)
  return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
