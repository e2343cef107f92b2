"""tfjax/nn/kinds/longformer.py against a dense NumPy Longformer written from the paper (Beltagy
et al. 2020, sec. 3.1): a full score matrix masked to the window band plus the global rows and
columns, the global rows scored with their own projections; and the properties that make it
Longformer (a local token ignores what is outside its window and not global)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_helpers
from conftest import fast_jit, random_params, tiny_config, to_numpy
from np_reference import rand
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.kinds import longformer
from tfjax.nn.models import build_model
from tfjax.training.accounting import flops
from tfjax.training.loop import train
from tfjax.training.accounting import params as param_accounting

KIND = dict(attention_kind="longformer", family="encoder", position="learned")


def np_softmax(s):
  """Softmax over the last axis; a row with no visible key (-inf everywhere) gives zeros."""
  m = s.max(-1, keepdims=True)
  e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
  return e / np.maximum(e.sum(-1, keepdims=True), 1e-300)


def np_longformer(q, k, v, qg, kg, vg, seg, w, g):
  """Dense reference, float64. q, k, v, kg, vg [B, T, H, E]; qg [B, G, H, E]; seg [B, T] (0 =
  padding). Local row i: keys with |i - j| <= w or j < g; global row i < g: every key, with the
  global projections. Both only over visible keys (same nonzero segment)."""
  batch, length, _, dim = q.shape
  i = np.arange(length)
  pattern = (np.abs(i[:, None] - i[None, :]) <= w) | (i[None, :] < g)
  out = np.zeros_like(q)
  for b in range(batch):
    same = (seg[b][None, :] != 0) & (seg[b][None, :] == seg[b][:, None])
    s = np.einsum("the,she->hts", q[b], k[b]) / np.sqrt(dim)
    s = np.where(pattern & same, s, -np.inf)
    out[b] = np.einsum("hts,she->the", np_softmax(s), v[b])
    for t in range(min(g, length)):
      s = np.einsum("he,she->hs", qg[b, t], kg[b]) / np.sqrt(dim)
      out[b, t] = np.einsum("hs,she->he", np_softmax(np.where(same[t], s, -np.inf)), vg[b])
  return out


def _kind_output(q, k, v, qg, kg, vg, seg, w, g):
  """The kind's math as `attend` composes it: local rows, then the first g rows replaced."""
  scale = q.shape[-1] ** -0.5
  g = min(g, q.shape[1])

  def run(q, k, v, qg, kg, vg, seg):
    out = longformer.local_attention(q, k, v, seg, one_sided=w, num_global=g, scale=scale)
    if not g:
      return out
    rows = longformer.global_attention(qg[:, :g], kg, vg, seg, scale=scale)
    return jnp.concatenate([rows, out[:, g:]], axis=1)
  return np.asarray(fast_jit(run)(q, k, v, qg, kg, vg, seg))


@pytest.mark.parametrize("length,w,g,padded", [
    (12, 2, 0, False),   # sliding window only, T a multiple of w
    (11, 3, 2, False),   # T not a multiple of the block
    (10, 2, 4, True),    # more global tokens than w; right padding
    (6, 8, 1, False),    # window wider than the sequence: full attention
    (9, 1, 9, True),     # every token global
])
def test_banded_form_matches_the_dense_reference(length, w, g, padded):
  batch, heads, dim = 2, 2, 4
  q, k, v, kg, vg = (rand((batch, length, heads, dim), seed=s) for s in range(5))
  qg = rand((batch, max(g, 1), heads, dim), seed=5)
  seg = np.ones((batch, length), np.int32)
  if padded:
    seg[0, length - 3:] = 0
    seg[1, length - 1:] = 0
  ours = _kind_output(q, k, v, qg, kg, vg, jnp.asarray(seg), w, g)
  ref = np_longformer(*(np.asarray(a, np.float64) for a in (q, k, v, qg, kg, vg)), seg, w, g)
  real = seg.astype(bool)  # padding rows attend to nothing; their values are not compared
  np.testing.assert_allclose(ours[real], ref[real], rtol=2e-5, atol=2e-5)


def test_packed_segments_do_not_see_each_other():
  """Segment ids 1, 1, 1, 2, 2, ...: every row equals the reference's same-segment softmax."""
  q, k, v, kg, vg = (rand((1, 10, 2, 4), seed=s) for s in range(5))
  qg = rand((1, 2, 2, 4), seed=9)
  seg = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]], np.int32)
  ours = _kind_output(q, k, v, qg, kg, vg, jnp.asarray(seg), 2, 2)
  ref = np_longformer(*(np.asarray(a, np.float64) for a in (q, k, v, qg, kg, vg)), seg, 2, 2)
  np.testing.assert_allclose(ours[0, :9], ref[0, :9], rtol=2e-5, atol=2e-5)


def np_block(p, x, w, g):
  """The whole attention block from its parameters: projections (local and global), the dense
  reference, output projection. [B, T, D] float64."""
  proj = lambda name, a: np.einsum("btd,dhk->bthk", a, p[name]["kernel"]) + p[name]["bias"]
  o = np_longformer(proj("query", x), proj("key", x), proj("value", x),
                    proj("query_global", x[:, :g]), proj("key_global", x),
                    proj("value_global", x), np.ones(x.shape[:2], np.int32), w, g)
  return np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_the_block_computes_the_paper_with_separate_global_projections():
  cfg = tiny_config(**KIND, longformer_window=4, longformer_global_tokens=2)
  module = MultiHeadAttention(cfg)
  x = rand((2, 9, 16))
  params = random_params(module, x, seed=3, scale=0.4)
  assert set(params) >= {"query_global", "key_global", "value_global"}
  y = np.asarray(fast_jit(lambda p, a: module.apply({"params": p}, a))(params, x))
  np.testing.assert_allclose(y, np_block(to_numpy(params), np.asarray(x, np.float64), 2, 2),
                             rtol=2e-5, atol=2e-5)


def test_a_local_token_ignores_tokens_outside_its_window_unless_global():
  """Changing tokens farther than w from local token i that are not global leaves its output
  unchanged; changing a global token changes it; changing any token changes a global row."""
  cfg = tiny_config(**KIND, longformer_window=4, longformer_global_tokens=1)
  module = MultiHeadAttention(cfg)
  x = np.asarray(rand((1, 12, 16)))
  params = random_params(module, x, seed=4)
  run = fast_jit(lambda a: module.apply({"params": params}, a))
  base = np.asarray(run(x))
  i, w = 6, 2
  far = [j for j in range(1, 12) if abs(j - i) > w]
  moved = x.copy()
  moved[:, far] += 1.0
  out = np.asarray(run(moved))
  np.testing.assert_allclose(out[:, i], base[:, i], rtol=1e-6, atol=1e-6)
  assert np.abs(out[:, 0] - base[:, 0]).max() > 1e-3  # the global row sees them
  moved = x.copy()
  moved[:, 0] += 1.0  # the global token, far from i
  assert np.abs(np.asarray(run(moved))[:, i] - base[:, i]).max() > 1e-3


def test_right_padding_does_not_change_the_real_tokens():
  cfg = tiny_config(**KIND, longformer_window=2, longformer_global_tokens=2, mlm_head=True)
  model = build_model(cfg)
  ids = np.random.default_rng(0).integers(1, 31, size=(1, 7)).astype(np.int32)
  padded = np.concatenate([ids, np.zeros((1, 5), np.int32)], axis=1)
  seg = (np.arange(12) < 7).astype(np.int32)[None]
  params = random_params(model, padded, seed=2)
  run = fast_jit(lambda p, a, s: model.apply({"params": p}, a, segment_ids=s)["hidden"])
  short = np.asarray(run(params, ids, np.ones_like(ids)))
  long = np.asarray(run(params, padded, seg))
  np.testing.assert_allclose(long[:, :7], short, rtol=1e-5, atol=1e-5)


def test_parameter_count_is_exact_and_flops_are_linear_in_length():
  cfg = tiny_config(**KIND, longformer_window=4, longformer_global_tokens=1, num_layers=2)
  softmax = tiny_config(family="encoder", position="learned", num_layers=2)
  counts = param_accounting.count_by_category(cfg)
  d, width = 16, 16  # TINY: d_model 16 = 2 heads x 8
  assert counts["attention"] == (param_accounting.count_by_category(softmax)["attention"]
                                 + 2 * 3 * (d * width + width))
  assert param_accounting.analytic_count(cfg) == sum(counts.values())
  n = param_accounting.analytic_count(cfg) - param_accounting.lookup_only_count(cfg)
  # Per layer at L = 16: QK^T and AV over 3c = 6 banded + 1 global key, the global row's 16
  # keys once per 16 tokens: 4 * 2 * 8 * (6 + 2) * 3 = 1536; 6N counts qg, kg, vg on every
  # token, of which qg runs on 1 of 16: minus 6 * 16 * 16 * (1 - 1/16) = 1440.
  assert flops.flops_per_token(cfg, 16) == pytest.approx(6 * n + 2 * (1536 - 1440))
  grow = flops.flops_per_token(cfg, 8192) - flops.flops_per_token(cfg, 1024)
  assert abs(grow) < 6 * d * width  # flat in L (O(L) total), where softmax's grows with L
  assert flops.flops_per_token(softmax, 8192) - flops.flops_per_token(softmax, 1024) > 1e5


def test_gradients_reach_the_global_projections_only_with_global_tokens():
  x = rand((2, 8, 16))
  for g in (1, 0):
    cfg = tiny_config(**KIND, longformer_window=2, longformer_global_tokens=g)
    module = MultiHeadAttention(cfg)
    params = random_params(module, x, seed=5)
    grads = fast_jit(jax.grad(lambda p, a: module.apply({"params": p}, a).sum()))(params, x)
    norms = {name: float(jnp.abs(grads[name]["kernel"]).max())
             for name in ("query", "query_global", "key_global", "value_global")}
    assert all(np.isfinite(list(norms.values()))) and norms["query"] > 0, norms
    assert all((norms[n] > 0) == bool(g) for n in longformer.GLOBAL_PROJECTIONS), (g, norms)


@pytest.mark.parametrize("overrides,patterns", [
    (dict(longformer_window=5), ["model.longformer_window=5", "even"]),
    (dict(longformer_window=0), ["model.longformer_window=0"]),
    (dict(longformer_global_tokens=-1), ["model.longformer_global_tokens=-1"]),
    (dict(family="decoder"), ["longformer", "model.family='decoder'", "encoder"]),
    (dict(num_kv_heads=1), ["longformer", "model.num_kv_heads=1"]),
    (dict(position="rope"), ["longformer", "model.position='rope'", "learned"]),
    (dict(qk_norm="rmsnorm"), ["longformer", "model.qk_norm='rmsnorm'"]),
    (dict(position="alibi"), ["model.position='alibi'", "longformer"]),
    (dict(decode=True), ["longformer", "decode=True"]),
    (dict(attention_scale=1.0), ["model.attention_scale=1.0", "longformer"]),
])
def test_rejects_what_it_cannot_compute(overrides, patterns):
  with pytest.raises(ValueError) as info:
    tiny_config(**{**KIND, **overrides})
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)


def test_its_keys_are_refused_under_another_kind():
  with pytest.raises(ValueError, match="longformer_window"):
    tiny_config(family="encoder", longformer_window=8)


def test_compiled_memory_of_the_band_grows_linearly_in_length():
  """XLA's temporary buffers for forward + backward of the local attention double when L
  doubles (a dense score matrix would quadruple): the O(L w) memory of
  docs/attention/longformer.md, read from the compiled program (nothing runs)."""
  def temp_bytes(length):
    s = jax.ShapeDtypeStruct((1, length, 2, 8), jnp.float32)
    loss = lambda q, k, v: longformer.local_attention(
        q, k, v, None, one_sided=8, num_global=1, scale=0.1).sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(s, s, s).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
      pytest.skip("this backend reports no memory analysis")
    return analysis.temp_size_in_bytes
  ratio = temp_bytes(1024) / temp_bytes(512)
  assert 1.8 < ratio < 2.2, ratio


def test_a_classifier_trains_with_attention_dropout(tmp_path):
  """train_and_evaluate on the majority task: the global [CLS] token (G = 1) is the pooled one;
  attention dropout draws its masks from the 'dropout' rng. The loss falls."""
  config = run_helpers.tiny_config(num_steps=40, eval_every=40, log_every=1, checkpoint_every=40)
  config.task = "classification"
  config.data.update(name="majority", test_lengths=(8,))
  config.model.update(family="encoder", pooler=True, num_classes=2, mlm_head=False,
                      position="learned", attention_kind="longformer", longformer_window=2,
                      longformer_global_tokens=1, attention_dropout=0.1)
  workdir = str(tmp_path / "run")
  final = train.train_and_evaluate(config, workdir)
  losses = [m["train/loss"] for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  assert len(losses) == 40 and np.isfinite(final["eval/loss"]) and np.all(np.isfinite(losses))
  assert np.mean(losses[-8:]) < np.mean(losses[:8]), losses
