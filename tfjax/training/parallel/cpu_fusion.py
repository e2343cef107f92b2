"""XLA:CPU performance workarounds, kept out of the model blocks: a fusion boundary on the
residual-stream gradient (one switch, `install`), and one flat gradient all-reduce for data
parallelism over CPU devices.

The fusion boundary. XLA:CPU fuses the elementwise backward math that forms the residual-stream
gradient (LayerNorm's backward plus the skip-connection sum) into the transposes that feed the
weight-gradient matmuls dW = x^T g, and such transpose fusions run scalar and strided. XLA:CPU
drops `optimization_barrier`, but cannot fuse across a data-dependent `lax.cond`, so routing the
cotangent through one makes it be written once, vectorized, and the transpose becomes a plain
copy. docs/benchmarks/cpu_training.md ("Where XLA's CPU backward lost the time") has the profile
and the measurements.
(The same boundary on the activation derivatives does not pay; it is not applied.)

How it is applied, and why this way. The blocks (tfjax/nn/layers.py) are the published math only.
A Flax method interceptor (`interceptor`) wraps the residual-stream input `x` of every
`TransformerLayer.sublayer(name, x, fn)` call in an identity whose cotangent goes through the
cond. The method is bound by attribute (`TransformerLayer.sublayer`, read at import: renaming it
fails here, loudly), and every traced function checks that a TransformerLayer it applied did pass
its residual stream through the boundary (a layer that stops calling that method raises
`BoundaryMissed` instead of silently losing the workaround). Whoever builds a differentiated step
wraps the function it traces with `applied(fn)`:
  * the interceptor is entered inside the traced function, so it holds on whichever thread traces
    it (Flax keeps interceptors per thread, like logical axis rules), and only there: eval,
    init and decoding programs are untouched (the identity changes nothing without a gradient);
  * `install(policy)` is the one switch, decided once at setup before any step is traced
    (jit caches what it traced): 'auto' (the default, what a caller that never calls `install`
    gets) turns it on when JAX's default backend is CPU, so GPU/TPU programs are exactly those
    of the unwrapped function; 'on' / 'off' force it either way.
A module-level policy read by the blocks would have kept the workaround's call site inside the
model; the interceptor keeps the blocks unaware of it and the switch in one place.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec

from tfjax.nn.choices import one_of
from tfjax.nn.layers import TransformerLayer

POLICIES = ("auto", "on", "off")
_policy = "auto"
# The layer method whose input `x` is the residual stream entering a sublayer. An attribute
# lookup, not a string: a renamed method stops the import here.
RESIDUAL_METHOD = TransformerLayer.sublayer.__name__
_traces = threading.local()  # per thread (as Flax's interceptors): counts of the current trace


class BoundaryMissed(RuntimeError):
  """A TransformerLayer was applied under the fusion boundary but none of its residual streams
  went through it."""


def install(policy: str = "auto") -> None:
  """Sets the fusion-boundary policy for every step traced afterwards: 'auto' (on iff JAX's
  default backend is CPU), 'on' or 'off'. Call once at setup, before the first trace."""
  global _policy
  _policy = one_of("cpu_fusion policy", policy, POLICIES)


def installed() -> str:
  """The policy set by `install` ('auto' unless it was called)."""
  return _policy


def enabled() -> bool:
  """Whether `applied` adds the fusion boundary (reads the backend for 'auto': call it after the
  devices are configured, i.e. when tracing)."""
  return _policy == "on" or (_policy == "auto" and _backend_is_cpu())


def _backend_is_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _materialized(value, never):
  """`value`, computed in its own fusion: a cond on `never`, a predicate that is never true but
  cannot be folded away. Linear in `value`, so JAX can transpose it."""
  return jax.lax.cond(never, jnp.zeros_like, lambda v: v, value)


@jax.custom_jvp
def materialized_cotangent(x, never):
  """Identity in `x` whose cotangent is computed in its own fusion (see the module docstring);
  `never`: a bool scalar, false at run time, that XLA cannot fold."""
  del never
  return x


@materialized_cotangent.defjvp
def _materialized_cotangent_jvp(primals, tangents):
  (x, never), (t, _) = primals, tangents
  # A custom JVP (not VJP) keeps forward-mode autodiff working; transposed for the backward pass,
  # this cond materializes the cotangent.
  return x, _materialized(t, never)


def _never_true(x):
  """A run-time-false predicate: the one `unbatched_predicate` set for this trace, else one
  computed from the primal `x` itself."""
  never = getattr(_traces, "never", None)
  return jnp.isnan(x.reshape(-1)[0]) if never is None else never


@contextlib.contextmanager
def unbatched_predicate(never) -> Iterator[None]:
  """Inside: the boundaries traced on this thread branch on `never` (a bool scalar, false at run
  time) instead of on a value of the residual stream.

  Why: under `jax.vmap` (packed seeds, tfjax/training/loop/packed.py) a predicate computed from the
  batched residual stream is batched, and JAX lowers a cond with a batched predicate to a select
  of both branches, which XLA fuses across: the boundary would vanish. A predicate from outside
  the vmap stays unbatched, and the cond stays a cond."""
  outer, _traces.never = getattr(_traces, "never", None), never
  try:
    yield
  finally:
    _traces.never = outer


def interceptor(next_fun, args, kwargs, context):
  """Flax method interceptor: the residual stream entering each `TransformerLayer.sublayer` goes
  through `materialized_cotangent`; every other method call is passed through unchanged."""
  counts = getattr(_traces, "counts", None)
  if counts is not None and isinstance(context.module, TransformerLayer):
    counts["layers"] += context.method_name == "__call__"
    counts["boundaries"] += context.method_name == RESIDUAL_METHOD
  if context.method_name == RESIDUAL_METHOD and isinstance(context.module, TransformerLayer):
    if len(args) != 3 or kwargs:
      raise TypeError("cpu_fusion.interceptor expects TransformerLayer.sublayer(name, x, fn) "
                      f"called positionally; got {len(args)} positional and {sorted(kwargs)}")
    name, x, fn = args
    return next_fun(name, materialized_cotangent(x, _never_true(x)), fn)
  return next_fun(*args, **kwargs)


@contextlib.contextmanager
def intercepting() -> Iterator[None]:
  """Inside: model code traced on this thread gets the fusion boundary if `enabled()`."""
  if not enabled():
    yield
    return
  outer, _traces.counts = getattr(_traces, "counts", None), {"layers": 0, "boundaries": 0}
  try:
    with nn.intercept_methods(interceptor):
      yield
    counts = _traces.counts
  finally:
    _traces.counts = outer
  if counts["layers"] and not counts["boundaries"]:
    raise BoundaryMissed(
        f"cpu_fusion: {counts['layers']} TransformerLayer call(s) traced but no residual stream "
        f"went through TransformerLayer.{RESIDUAL_METHOD}; route each sublayer through that "
        "method (or set --config.train.cpu_fusion=off)")


def applied(fn: Callable) -> Callable:
  """`fn` (a loss or step function to be traced and differentiated) running under
  `intercepting()`: wrap the function once where the step is built."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with intercepting():
      return fn(*args, **kwargs)
  return wrapped


def flat_all_reduce_applies(mesh, model_config) -> bool:
  """Whether `summed_over_shards` should replace GSPMD's gradient all-reduce: on one CPU host,
  a mesh that is data parallel only (config.mesh.cpu_devices), and no dropout (whose masks
  shard_map would draw per shard, unlike the global draw of the other path)."""
  data_only = mesh.shape.get("data", 1) > 1 and mesh.size == mesh.shape["data"]
  # The mesh's own devices, not the default backend: a CPU host compiling for TPU or GPU
  # devices (tfjax.aot) must build the program those devices would run.
  on_cpu = mesh.devices.flat[0].platform == "cpu"
  # Models of their own (ViT, CLIP, Whisper, Funnel: tfjax/training/tasks/) have no dropout.
  dropout = getattr(model_config, "dropout", 0)
  attention_dropout = getattr(getattr(model_config, "attention", None), "dropout", 0)
  return (on_cpu and jax.process_count() == 1 and data_only
          and dropout == 0 and attention_dropout == 0)


def summed_over_shards(fn, mesh, batch_spec):
  """`fn(params, batch, rng) -> pytree of sums over the batch`, computed on each data shard and
  added up with ONE all-reduce of a flat vector.

  Why: XLA:CPU all-reduces a tuple of buffers one rendezvous per buffer (~50 per step for a
  4-layer GPT), and each rendezvous waits for the slower device; one flat buffer makes it one
  (docs/benchmarks/cpu_training.md, "One flat gradient all-reduce"). The sums equal GSPMD's to
  float rounding: tests/training/test_sharding.py (8 devices vs 1) and
  tests/training/test_train.py (with gradient accumulation)."""
  axes = batch_spec[0]

  def local(params, batch, rng):
    with nn.logical_axis_rules(()):  # inside shard_map every array is already this shard's
      sums = fn(params, batch, rng)
    flat, unflatten = ravel_pytree(sums)
    return unflatten(jax.lax.psum(flat, axes))

  replicated = PartitionSpec()
  return jax.shard_map(local, mesh=mesh, in_specs=(replicated, batch_spec, replicated),
                       out_specs=replicated, check_vma=False)
