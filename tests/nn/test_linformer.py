"""tfjax/nn/kinds/linformer.py: the block against NumPy written from the paper's eq. 7 (Wang et al.
2020), each sharing option, padding, full softmax attention at k = n with E = F = identity, the
exact parameter and FLOP counts, the rejections and a short training run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_helpers
from conftest import random_params, tiny_config, to_numpy
from np_reference import np_mha, rand
from tfjax.nn.attention import MultiHeadAttention
from tfjax.training.accounting import flops
from tfjax.training.loop import train
from tfjax.training.accounting import params as param_accounting


pytestmark = pytest.mark.usefixtures("fast_compiles")  # conftest.py: tiny shapes


def np_linformer_block(p, x, seg=None):
  """head_h = softmax(Q_h (E_h K_h)^T / sqrt(d)) (F_h V_h) (eq. 7) with E, F the first L columns
  of the layer's [k, n] (shared) or [K, k, n] (per kv head) matrices; padding keys and values
  zeroed before projecting, padding queries 0. x [B, L, D] float64 -> [B, L, D]."""
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  length, heads, kv_heads = x.shape[1], q.shape[2], k.shape[2]
  if seg is not None:
    k, v = k * (seg != 0)[:, :, None, None], v * (seg != 0)[:, :, None, None]
  e = p["linformer_e"][..., :length]
  f = p.get("linformer_f", p["linformer_e"])[..., :length]
  out = np.zeros_like(q)
  for h in range(heads):
    g = h // (heads // kv_heads)  # the kv head of query head h
    e_h, f_h = (e[g], f[g]) if e.ndim == 3 else (e, f)
    kp, vp = np.einsum("rs,bse->bre", e_h, k[:, :, g]), np.einsum("rs,bse->bre", f_h, v[:, :, g])
    scores = np.einsum("bte,bre->btr", q[:, :, h], kp) / np.sqrt(q.shape[-1])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    out[:, :, h] = np.einsum("btr,bre->bte", probs / probs.sum(-1, keepdims=True), vp)
  if seg is not None:
    out = out * (seg != 0)[:, :, None, None]
  return np.einsum("bthe,hed->btd", out, p["out"]["kernel"]) + p["out"]["bias"]


def linformer_config(**overrides):
  return tiny_config(**{"attention_kind": "linformer", "family": "encoder", "position": "none",
                        "linformer_k": 5, **overrides})


@pytest.mark.parametrize("sharing,kv_heads", [("none", 1), ("none", 2), ("headwise", 2),
                                              ("kv", 1)])
def test_the_block_computes_the_papers_projected_attention(sharing, kv_heads):
  """Random E, F (and biases), a sequence shorter than n = max_len (the first L columns), and
  padding keys that must add nothing (made large, so counting them would show)."""
  cfg = linformer_config(linformer_sharing=sharing, num_kv_heads=kv_heads)
  module = MultiHeadAttention(cfg)
  x = rand((2, 11, 16), seed=1)
  seg = np.array([[1] * 11, [1] * 7 + [0] * 4], np.int32)
  x[1, 7:] *= 50.0
  params = random_params(module, x, seed=2, scale=0.4)
  y = np.asarray(jax.jit(lambda p, x_, s: module.apply(
      {"params": p}, x_, q_segment_ids=s, kv_segment_ids=s))(params, x, seg))
  ref = np_linformer_block(to_numpy(params), np.asarray(x, np.float64), seg)
  np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)


def test_k_equal_n_with_identity_projections_is_full_softmax_attention():
  cfg = linformer_config(linformer_k=16, max_len=16, linformer_sharing="headwise")
  module = MultiHeadAttention(cfg)
  x = rand((2, 16, 16), seed=3)
  params = random_params(module, x, seed=4, scale=0.4)
  params = dict(params, linformer_e=jnp.eye(16), linformer_f=jnp.eye(16))
  y = np.asarray(jax.jit(module.apply)({"params": params}, x))
  ref, _ = np_mha(to_numpy(params), x)  # the full softmax attention reference
  np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)


def test_an_input_longer_than_the_projection_is_an_error():
  module = MultiHeadAttention(linformer_config())
  x = rand((1, 17, 16))
  with pytest.raises(ValueError, match=r"17 keys.*model.max_len = 16"):
    module.init(jax.random.PRNGKey(0), x)


@pytest.mark.parametrize("sharing,own", [("none", 2 * 2 * 5 * 16), ("headwise", 2 * 5 * 16),
                                         ("kv", 5 * 16)])
def test_parameter_counts_are_exact_and_flops_flat_in_the_length(sharing, own):
  """The initialized tree (eval_shape) holds softmax's parameters plus E and F per layer; the
  analytic count agrees; FLOPs per token are 6N plus 12 k E (H + K) per layer."""
  cfg = linformer_config(linformer_sharing=sharing, num_layers=2)
  counts = param_accounting.count_by_category(cfg)
  softmax = param_accounting.count_by_category(tiny_config(family="encoder", position="none",
                                                           num_layers=2))
  assert counts["attention"] == softmax["attention"] + 2 * own
  assert param_accounting.analytic_count(cfg) == sum(counts.values())
  n = param_accounting.analytic_count(cfg) - param_accounting.lookup_only_count(cfg)
  for seq_len in (8, 16):
    assert flops.flops_per_token(cfg, seq_len) == 6 * n + 2 * 12 * 5 * 8 * (2 + 2)


@pytest.mark.parametrize("overrides,patterns", [
    (dict(family="decoder"), ["linformer", "model.family='decoder'", "family='encoder'"]),
    (dict(family="encoder_decoder"), ["linformer", "model.family='encoder_decoder'"]),
    (dict(linformer_sharing="layerwise"), ["model.linformer_sharing='layerwise'", "'kv'"]),
    (dict(linformer_sharing="heads"), ["model.linformer_sharing='heads'", "'headwise'"]),
    (dict(linformer_k=0), ["model.linformer_k=0", "positive"]),
    (dict(linformer_k=17), ["model.linformer_k=17", "model.max_len=16"]),
    (dict(position="alibi"), ["model.position='alibi'", "linformer"]),
    (dict(attention_softcap=30.0), ["model.attention_softcap=30.0", "linformer"]),
])
def test_rejects_what_the_projection_cannot_compute(overrides, patterns):
  with pytest.raises(ValueError) as info:
    linformer_config(**overrides)
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)


def test_linformer_trains_through_the_training_loop(tmp_path):
  """train_and_evaluate of an encoder classifier (majority task) with k < n: finite losses."""
  config = run_helpers.tiny_config(num_steps=12, eval_every=12, checkpoint_every=12)
  config.task = "classification"
  config.data.update(name="majority", test_lengths=(8,))
  config.model.update(family="encoder", pooler=True, num_classes=2, mlm_head=False,
                      attention_kind="linformer", linformer_k=8)
  workdir = str(tmp_path / "run")
  final = train.train_and_evaluate(config, workdir)
  losses = [m["train/loss"] for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  assert len(losses) == 12 and all(np.isfinite(losses)) and np.isfinite(final["eval/loss"])
  assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
