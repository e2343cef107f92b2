"""Sharded attention against the one-device kernel, on 8 CPU devices, in ONE process.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/nn/sharded_attention_cases.py

Started by tests/nn/test_sharded_attention.py so the rest of the suite keeps one device. For every
mesh (data, fsdp, tensor, context) and case it jits `value_and_grad` of a scalar function of the
attention output, once with no mesh (the one-device kernel) and once under the mesh with the
default rules, and prints one JSON line: {case: {"out": rel err, "dq": .., "dk": .., "dv": ..,
"per_device": bool}} ('per_device': the program holds a manual (shard_map) computation), the
query positions each device works on over a context axis of 8 ('dealt'), and the refusals'
messages.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import ops
from tfjax.training.parallel import sharding

MESHES = ((8, 1, 1, 1), (2, 2, 2, 1), (1, 1, 8, 1), (2, 1, 1, 4), (1, 2, 2, 2), (1, 1, 1, 8))
B, T, E = 8, 32, 8


def _inputs(heads, kv_heads, seed=0):
  r = np.random.RandomState(seed)
  q = jnp.asarray(r.randn(B, T, heads, E), jnp.float32)
  k = jnp.asarray(r.randn(B, T, kv_heads, E), jnp.float32)
  v = jnp.asarray(r.randn(B, T, kv_heads, E), jnp.float32)
  return q, k, v


def _segments():
  """Two packed documents per row, split at a different place in every row, then padding."""
  ids = np.zeros((B, T), np.int32)
  for b in range(B):
    cut, end = 5 + 2 * b, T - b
    ids[b, :cut], ids[b, cut:end] = 1, 2
  return jnp.asarray(ids)


CASES = {
    # name: (implementation, heads, kv_heads, keyword arguments)
    "causal_gqa": ("chunked", 8, 2, dict(causal=True)),
    "bidirectional_mqa": ("chunked", 8, 1, dict(causal=False)),
    "window_alibi_segments_softcap": ("chunked", 8, 2, dict(
        causal=True, window=7, alibi_slopes=jnp.linspace(0.05, 0.8, 8), segments=True,
        softcap=5.0)),
    "pallas_causal_gqa_dropout": ("pallas", 8, 2, dict(causal=True, dropout=0.25)),
    "pallas_mqa_alibi_segments": ("pallas", 8, 1, dict(
        causal=True, alibi_slopes=jnp.linspace(0.05, 0.8, 8), segments=True)),
    "pallas_window_alibi_segments_softcap": ("pallas", 8, 2, dict(
        causal=True, window=7, alibi_slopes=jnp.linspace(0.05, 0.8, 8), segments=True,
        softcap=5.0)),
    "pallas_bidirectional_gqa_dropout": ("pallas", 8, 2, dict(causal=False, dropout=0.25)),
}
# Pallas kernels compiled in interpret mode are slow to build on CPU (each context device count
# adds one kernel per chunk): the pallas cases run on these meshes only.
PALLAS_MESHES = {
    "pallas_causal_gqa_dropout": ((2, 2, 2, 1), (1, 2, 2, 2)),
    "pallas_mqa_alibi_segments": ((1, 1, 8, 1),),
    "pallas_window_alibi_segments_softcap": ((2, 1, 1, 4),),
    "pallas_bidirectional_gqa_dropout": ((1, 2, 2, 2),),
}


def meshes(name):
  return PALLAS_MESHES.get(name, MESHES)


def _kwargs(spec):
  kw = dict(spec)
  if kw.pop("segments", False):
    ids = _segments()
    kw.update(q_segment_ids=ids, kv_segment_ids=ids)
  rate = kw.pop("dropout", 0.0)
  if rate:
    kw.update(dropout_rate=rate, dropout_rng=jax.random.PRNGKey(7))
  return kw


def _step(impl, kw):
  def loss(q, k, v):
    out = ops.dot_product_attention(q, k, v, implementation=impl, **kw)
    return jnp.sum(out * jnp.cos(out)), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))


def _decoder_on_context_mesh(position: str, impl: str):
  """Relative difference of a tiny causal decoder's loss and parameter gradients between one
  device and the mesh (2, 1, 1, 4) (the sequence split 4 ways, activations laid out by the rules)."""
  from tfjax.nn.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from tfjax.nn.models import build_model  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_flat(dict(
      family="decoder", vocab_size=17, d_model=32, num_layers=2, num_heads=4, d_ff=64,
      max_len=64, position=position, attention_impl=impl, init_std=0.2)).validated()
  model = build_model(cfg)
  r = np.random.RandomState(1)
  tokens = jnp.asarray(r.randint(1, 17, (4, T)), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens)["params"]

  def loss(p):
    logits = model.apply({"params": p}, tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, jnp.roll(tokens, -1, 1)[..., None], -1)[..., 0])

  ref = jax.jit(jax.value_and_grad(loss))(params)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 1, 1, 4), sharding.MESH_AXES)
  with sharding.axis_rules(mesh, sharding.DEFAULT_RULES):
    got = jax.jit(jax.value_and_grad(loss))(params)
  # One scale for all gradients: the key bias' is 0 in exact arithmetic (softmax ignores a shift
  # of a row's logits), so its own relative error would compare rounding noise with itself.
  flat = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (ref, got)]
  return _rel(*flat)


def main():
  report = {}
  for name, (impl, heads, kv_heads, spec) in CASES.items():
    q, k, v = _inputs(heads, kv_heads)
    kw = _kwargs(spec)
    (_, ref_out), ref_grads = _step(impl, kw)(q, k, v)
    for shape in meshes(name):
      mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(shape), sharding.MESH_AXES)
      with sharding.axis_rules(mesh, sharding.DEFAULT_RULES):
        lowered = _step(impl, kw).lower(q, k, v)
        (_, out), grads = lowered.compile()(q, k, v)
      report[f"{name}@{','.join(map(str, shape))}"] = {
          "out": _rel(ref_out, out), **{n: _rel(r, g) for n, r, g in
                                        zip(("dq", "dk", "dv"), ref_grads, grads)},
          "per_device": "manual" in lowered.as_text().lower()}
  # The zigzag deal itself: which positions each of 8 context devices attends for.
  from tfjax.nn import sharded_attention  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(1, 1, 1, 8), sharding.MESH_AXES)
  spec = jax.sharding.PartitionSpec("context")
  deal = jax.jit(jax.shard_map(lambda x: sharded_attention._deal(x, 0, ("context",), 8),  # pylint: disable=protected-access
                               mesh=mesh, in_specs=spec, out_specs=spec))
  dealt = np.asarray(deal(jnp.arange(64, dtype=jnp.int32))).reshape(8, 8).tolist()
  positions = {}  # whole decoders on a context mesh: every position kind reads global indices
  for kind, impl in (("learned", "chunked"), ("sinusoidal", "chunked"), ("alibi", "chunked"),
                     ("t5_bias", "auto"), ("rope", "pallas")):
    positions[f"{kind}/{impl}"] = _decoder_on_context_mesh(kind, impl)
  refusals = {}
  q, k, v = _inputs(8, 2)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 1, 1, 4), sharding.MESH_AXES)
  for name, impl, kw in (
      ("pallas_context_bidirectional_alibi", "pallas", dict(
          causal=False, alibi_slopes=jnp.linspace(0.05, 0.8, 8))),
      ("dropout_context", "auto", dict(causal=True, dropout_rate=0.1,
                                          dropout_rng=jax.random.PRNGKey(0))),
      ("indivisible_length", "chunked", dict(causal=True))):
    qq, kk, vv = (x[:, :28] for x in (q, k, v)) if name == "indivisible_length" else (q, k, v)
    try:
      with sharding.axis_rules(mesh, sharding.DEFAULT_RULES):
        jax.jit(lambda a, b, c, kw=kw, impl=impl: ops.dot_product_attention(
            a, b, c, implementation=impl, **kw)).lower(qq, kk, vv)
      refusals[name] = None
    except ValueError as e:
      refusals[name] = str(e)
  print(json.dumps({"cases": report, "dealt": dealt, "positions": positions,
                    "refusals": refusals}))


if __name__ == "__main__":
  assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
  main()
