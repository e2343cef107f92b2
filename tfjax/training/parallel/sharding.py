"""Device mesh and logical-axis sharding rules: the one place that knows about devices.

Every parameter is created with logical axis names (`nn.with_logical_partitioning`) and activations
carry `nn.with_logical_constraint`; `config.sharding_rules` maps those names onto the mesh axes
('data', 'fsdp', 'tensor', 'context'). The defaults give
  * data parallelism over data x fsdp: 'batch' -> ('data', 'fsdp'), every device its own rows;
  * ZeRO-3 / FSDP over fsdp: 'embed' -> 'fsdp' splits every weight matrix (all of them have an
    embed axis) and, through `follow_params`, the Adam moments with it. XLA all-gathers a
    layer's weights just before use and reduce-scatters its gradients. Activations never split
    'embed' over fsdp: 'batch' comes first in the rules and already uses that axis;
  * context (sequence) parallelism over context: 'length' -> 'context' splits every activation's
    sequence; attention all-gathers K/V over it (tfjax/nn/sharded_attention.py);
  * Megatron tensor parallelism over tensor: 'heads', 'kv_heads' and 'mlp' -> 'tensor' make W_Q,
    W_K, W_V and W_in column-parallel and W_O and W_out row-parallel, so each attention and FFN
    sublayer ends in one all-reduce; 'vocab' -> 'tensor' splits the embedding table and logits.
Any mix follows from the mesh shape alone. Rules are ordered: a logical name takes its mesh axes
only if no earlier name of the same array already took them (flax's `logical_to_mesh_axes`).

A parameter dimension that its mesh axes do not divide (e.g. 1 KV head of MQA on tensor=4) is
replicated instead: jit needs even shardings for its inputs and outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax.training.checkpointing.trees import path_names

_log = logging.getLogger(__name__)

# 'context' last: configs and `--mesh=D,F,T` written before it existed keep their meaning (it is 1).
MESH_AXES = ("data", "fsdp", "tensor", "context")

# logical axis -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", "context"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def mesh_size(mesh_config, axis: str) -> int:
  """config.mesh's size of `axis`; 1 for 'context' in a config written before it existed."""
  if axis == "context" and "context" not in mesh_config:
    return 1
  return int(mesh_config[axis])


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int, int]:
  """(data, fsdp, tensor, context) with at most one -1 filled by the remaining devices."""
  sizes = [mesh_size(mesh_config, a) for a in MESH_AXES]
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


HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def _jax_started() -> bool:
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):  # unknown JAX internals: assume the safe answer
    return True


def cpu_device_count(config, cores: int | None = None) -> int:
  """The XLA:CPU device count `config.mesh.cpu_devices` asks for (0 = leave JAX's default).

  -1 = one per core this process may use, lowered to the largest count that divides the batch
  (per micro-batch) and the eval batch, so that every device gets whole rows."""
  requested = int(config.mesh.get("cpu_devices", 0) or 0)
  if requested >= 0:
    return requested
  if requested != -1:
    raise ValueError(f"config.mesh.cpu_devices={requested}: use 0 (JAX's default), -1 (one per "
                     "core) or a positive device count")
  cores = cores or len(os.sched_getaffinity(0))
  micro = config.train.batch_size // max(config.optimizer.get("grad_accum_steps", 1), 1)
  return max(n for n in range(1, cores + 1)
             if micro % n == 0 and config.train.eval_batch_size % n == 0)


def configure_cpu_devices(config) -> int:
  """Splits the host CPU into `config.mesh.cpu_devices` XLA devices; call before JAX starts.

  Why: on a few cores, XLA:CPU runs each of a small model's matmuls on about one core, while the
  ops of one step form a chain that leaves little to run side by side. One device per core with
  the batch split over the 'data' axis keeps every core busy
  (measurements: docs/benchmarks/cpu_training.md).
  Sets --xla_force_host_platform_device_count in XLA_FLAGS, unless the environment already sets
  it (the user's value wins). Only the CPU platform is affected: on a GPU host the mesh still
  uses the GPUs. Returns the count requested (0: nothing to do).
  """
  count = cpu_device_count(config)
  if count == 0:
    return 0
  flags = os.environ.get("XLA_FLAGS", "")
  if HOST_DEVICES_FLAG in flags:
    _log.info("config.mesh.cpu_devices=%d: XLA_FLAGS already sets %s, keeping it",
              count, HOST_DEVICES_FLAG)
    return count
  if _jax_started():
    _log.warning("config.mesh.cpu_devices=%d not applied: JAX has already started; set "
                 "XLA_FLAGS=%s=%d before it does", count, HOST_DEVICES_FLAG, count)
    return count
  os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={count}".strip()
  return count


def make_mesh(mesh_config, devices=None) -> Mesh:
  """Mesh over `devices` (default: all, in jax.devices() order, i.e. grouped by process).

  Reshaped row-major, so 'data' is the outermost axis (it spans hosts first) and 'tensor' the
  innermost (its devices are neighbours on one host: NVLink for the all-reduce of every sublayer).
  """
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def rules(config) -> tuple:
  custom = config.get("sharding_rules", None) if hasattr(config, "get") else None
  return tuple(tuple(r) for r in custom) if custom else DEFAULT_RULES


def _use_mesh(mesh: Mesh):
  """The mesh as the current mesh. flax >= 0.11 resolves logical constraints only against
  `jax.sharding.get_abstract_mesh()`, which the old `with mesh:` does not set (the constraints
  would silently do nothing), so prefer jax.set_mesh / use_mesh."""
  for name in ("set_mesh", "use_mesh"):
    fn = getattr(jax, name, None) or getattr(jax.sharding, name, None)
    if fn is not None:
      return fn(mesh)
  return mesh  # old JAX: the Mesh context manager


@contextlib.contextmanager
def axis_rules(mesh: Mesh, logical_rules):
  """Activates the mesh and rules so nn.with_logical_constraint resolves inside jit."""
  with _use_mesh(mesh), nn.logical_axis_rules(logical_rules):
    yield


def axis_sizes(mesh_or_sizes) -> dict:
  """{'data': n, 'fsdp': n, 'tensor': n, 'context': n} from a Mesh or a (data, fsdp, tensor[,
  context]) tuple/dict (context 1 when not given)."""
  if isinstance(mesh_or_sizes, Mesh):
    return dict(mesh_or_sizes.shape)
  if isinstance(mesh_or_sizes, dict):
    return {"context": 1, **mesh_or_sizes}
  return {"context": 1, **dict(zip(MESH_AXES, (int(s) for s in mesh_or_sizes)))}


def _axes(entry) -> tuple:
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


_WARNED = set()


def partition_spec(shape, logical_axes, logical_rules, sizes: dict) -> PartitionSpec:
  """Mesh PartitionSpec of an array with these logical axes, replicating any dimension whose
  mesh axes do not divide it evenly."""
  spec = nn.logical_to_mesh_axes(tuple(logical_axes), logical_rules)
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = tuple(a for a in _axes(entry) if sizes.get(a, 1) > 1)  # size-1 axes split nothing
    ways = math.prod(sizes[a] for a in axes)
    if ways > 1 and dim % ways:
      key = (tuple(logical_axes), dim, axes)
      if key not in _WARNED:
        _WARNED.add(key)
        _log.warning("logical axes %s: dimension of size %d does not split %d ways over mesh "
                     "axes %s; that dimension is replicated instead", logical_axes, dim, ways,
                     axes)
      axes = ()
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*out)


def shard_shape(shape, spec: PartitionSpec, sizes: dict) -> tuple:
  """Per-device block shape of an array with this (evenly dividing) spec."""
  entries = tuple(spec) + (None,) * (len(shape) - len(spec))
  return tuple(d // math.prod(sizes.get(a, 1) for a in _axes(e)) for d, e in zip(shape, entries))


def _is_boxed(x):
  return isinstance(x, nn.LogicallyPartitioned)


def logical_specs(boxed_tree, logical_rules, sizes) -> object:
  """PartitionSpecs for a tree whose leaves may be nn.LogicallyPartitioned boxes (of arrays or
  ShapeDtypeStructs); unboxed leaves are replicated. `sizes`: mesh axis sizes (axis_sizes())."""
  sizes = axis_sizes(sizes)

  def one(leaf):
    if _is_boxed(leaf):
      return partition_spec(leaf.value.shape, leaf.names, logical_rules, sizes)
    return PartitionSpec()

  return jax.tree.map(one, boxed_tree, is_leaf=_is_boxed)


def logical_shardings(mesh: Mesh, boxed_tree, logical_rules):
  """NamedShardings for a tree whose leaves may be nn.LogicallyPartitioned boxes."""
  specs = logical_specs(boxed_tree, logical_rules, mesh)
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def follow_params(tree, param_tree, default, is_leaf=None):
  """For every leaf of `tree` (e.g. a train or optimizer state), the leaf of `param_tree`
  (shardings or specs) whose path is the longest suffix of the leaf's path, if its rank fits;
  else `default`. So Adam's mu/nu of a parameter share its layout: FSDP shards them too."""
  flat = {path_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(
      param_tree, is_leaf=is_leaf)[0]}

  def for_leaf(path, leaf):
    names = path_names(path)
    for size in range(len(names), 0, -1):  # the param path is a suffix of the moment's path
      match = flat.get(names[-size:])
      if match is not None:
        spec = match.spec if isinstance(match, NamedSharding) else match
        if len(spec) <= len(leaf.shape):
          return match
    return default

  return jax.tree_util.tree_map_with_path(for_leaf, tree)


def batch_sharding(mesh: Mesh, logical_rules) -> NamedSharding:
  """Leading (batch) axis split over the data-parallel mesh axes, the rest replicated."""
  spec = nn.logical_to_mesh_axes(("batch",), logical_rules)
  return NamedSharding(mesh, spec)


def batch_shards(sizes, logical_rules) -> int:
  """Into how many row blocks the rules split a batch on a mesh of these axis sizes."""
  sizes = axis_sizes(sizes)
  spec = nn.logical_to_mesh_axes(("batch",), logical_rules)
  return math.prod(sizes.get(a, 1) for a in _axes(spec[0] if len(spec) else None))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def _row_blocks(sharding: NamedSharding, rows: int) -> list[tuple[int, int]]:
  """Sorted distinct [start, stop) row blocks of this process's devices."""
  blocks = set()
  for index in sharding.addressable_devices_indices_map((rows,)).values():
    s = index[0]
    blocks.add((s.start or 0, rows if s.stop is None else s.stop))
  return sorted(blocks)


def process_rows(sharding: NamedSharding, global_rows: int) -> tuple[int, int]:
  """(row_start, row_count): the rows of a global batch that this process's devices hold.

  Computed from the sharding itself (not from jax.process_index()), so it is right for any mesh:
  with 'batch' split over data x fsdp and devices in process order each process holds one
  contiguous block; when 'batch' is replicated across processes (e.g. tensor spanning hosts)
  several processes read the same rows.
  """
  shards = batch_shards(sharding.mesh, _rules_of(sharding))
  if global_rows % shards:
    raise ValueError(f"a batch of {global_rows} rows does not split evenly over the {shards} "
                     "batch shards of the mesh")
  blocks = _row_blocks(sharding, global_rows)
  start, stop = blocks[0][0], blocks[-1][1]
  if sum(b - a for a, b in blocks) != stop - start:
    raise ValueError(
        f"this process's devices hold the non-contiguous row blocks {blocks} of the batch; build "
        "the mesh with sharding.make_mesh (devices in process order)")
  return start, stop - start


def _rules_of(sharding: NamedSharding):
  # batch_sharding's spec has one entry: the mesh axes of 'batch'. Rebuild a rule from it.
  entry = sharding.spec[0] if len(sharding.spec) else None
  return (("batch", entry),)


def global_rows(sharding: NamedSharding, local_rows: int) -> int:
  """Rows of the global batch of which this process holds `local_rows` (see process_rows)."""
  shards = batch_shards(sharding.mesh, _rules_of(sharding))
  local_blocks = len(_row_blocks(sharding, shards))
  return local_rows * shards // local_blocks


@dataclasses.dataclass(frozen=True)
class BatchPlacement:
  """Where a run's batches live: the mesh, its logical-axis rules, the batch shardings, which rows
  of each global batch this process builds, and how those rows become one global jax.Array.

  Built once per run (`BatchPlacement.create(config)`) and handed to the setup and the loop, so
  that they never recompute a sharding. A batch is split over its leading (row) axis as the
  rules place 'batch'; K stacked batches ([K, B, ...], one jitted call of K steps) keep the
  stacking axis on every device and split their rows the same way.

  On a mesh with a context axis of C devices every sequence ([rows, length] leaf) is padded at
  its end to a multiple of 2C (`length_multiple`: the zigzag chunks of
  tfjax/nn/sharded_attention.py), with zeros: segment id 0 (padding, which attention hides),
  loss weight 0. Causal tokens never see later ones, so no real token's output changes.
  """
  mesh: Mesh
  rules: tuple
  sharding: NamedSharding          # one batch [B, ...]; every leaf alike
  stacked_sharding: NamedSharding  # K batches [K, B, ...]
  length_multiple: int = 1         # sequences padded to a multiple of this (2 x context)

  @classmethod
  def create(cls, mesh: Mesh, logical_rules) -> "BatchPlacement":
    batch = batch_sharding(mesh, logical_rules)
    stacked = NamedSharding(mesh, PartitionSpec(None, *batch.spec))
    context = dict(mesh.shape).get("context", 1)
    return cls(mesh, tuple(logical_rules), batch, stacked, 2 * context if context > 1 else 1)

  @classmethod
  def for_config(cls, config) -> "BatchPlacement":
    """The mesh of `config.mesh` over all devices, and `config`'s sharding rules."""
    return cls.create(make_mesh(config.mesh), rules(config))

  def axis_rules(self):
    """Context manager: the mesh and rules as current, so activation constraints apply."""
    return axis_rules(self.mesh, self.rules)

  def replicated(self) -> NamedSharding:
    return replicated(self.mesh)

  def process_rows(self, global_rows: int) -> tuple[int, int]:
    """(row_start, row_count) of a `global_rows`-row batch that this process builds."""
    return process_rows(self.sharding, global_rows)

  def abstract(self, one_row: dict, rows: int, stacked: int | None = None) -> dict:
    """ShapeDtypeStructs (with their shardings) of a `rows`-row batch laid out like `one_row`
    (a one-row host batch), or of `stacked` such batches."""
    where, lead = (self.sharding, ()) if stacked is None else (self.stacked_sharding, (stacked,))
    return {k: jax.ShapeDtypeStruct(lead + (rows,) + np.shape(v)[1:], np.asarray(v).dtype,
                                    sharding=where)
            for k, v in self.padded(one_row).items()}

  def padded(self, batch: dict, row_axis: int = 0) -> dict:
    """`batch` with every sequence leaf ([rows, length], after `row_axis`) zero-padded at its end
    to a multiple of `length_multiple` (a context axis; unchanged without one)."""
    if self.length_multiple == 1:
      return batch
    out = {}
    for key, x in batch.items():
      x = np.asarray(x)
      if x.ndim == row_axis + 2:
        extra = -x.shape[row_axis + 1] % self.length_multiple
        widths = [(0, 0)] * x.ndim
        widths[row_axis + 1] = (0, extra)
        x = np.pad(x, widths)
      out[key] = x
    return out

  def put(self, local_batch: dict) -> dict:
    """This process's rows of a batch (host arrays) -> the global batch, sharded over devices."""
    return self._put(local_batch, self.sharding, row_axis=0)

  def put_stacked(self, local_batches: dict) -> dict:
    """The same for K stacked batches: leaves [K, rows, ...]."""
    return self._put(local_batches, self.stacked_sharding, row_axis=1)

  def _put(self, local_batch: dict, target: NamedSharding, row_axis: int) -> dict:
    local_batch = self.padded(local_batch, row_axis)

    def one(x):
      x = np.asarray(x)
      if jax.process_count() == 1:
        return jax.device_put(x, target)
      rows = global_rows(self.sharding, x.shape[row_axis])
      global_shape = x.shape[:row_axis] + (rows,) + x.shape[row_axis + 1:]
      return jax.make_array_from_process_local_data(target, x, global_shape)
    return {k: one(v) for k, v in local_batch.items()}
