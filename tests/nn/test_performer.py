"""tfjax/nn/kinds/performer.py: FAVOR+ against NumPy written from the paper's equations
(Choromanski et al. 2021, eq. 5 and section 2.4), its causal form against the masked quadratic
form of the same features, and the estimator's convergence rate to exact softmax attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_helpers
from conftest import random_params, tiny_config, to_numpy
from np_reference import rand
from tfjax.inference import cached_model
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.kinds import performer
from tfjax.nn.models import build_model
from tfjax.training.accounting import flops
from tfjax.training.loop import train
from tfjax.training.accounting import params as param_accounting


pytestmark = pytest.mark.usefixtures("fast_compiles")  # conftest.py: tiny shapes


def np_features(x, w, kernel="softmax"):
  """phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x E^-1/4 (paper eq. 5, h = exp(-|x|^2/2));
  relu: relu(W x) / sqrt(m). x [..., E], w [m, E], float64."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  m, e = w.shape
  if kernel == "relu":
    return np.maximum(x @ w.T, 0.0) / np.sqrt(m)
  x = x * e ** -0.25
  return np.exp(x @ w.T - 0.5 * (x ** 2).sum(-1, keepdims=True)) / np.sqrt(m)


def np_favor(q, k, v, w, mask=None, kernel="softmax"):
  """The quadratic form of the paper's estimator: A = phi(Q) phi(K)^T (times a visibility mask
  [B, T, S]), out = A V / A 1. q [B, T, H, E], k, v [B, S, H, E] (one head per kv head)."""
  a = np.einsum("bthm,bshm->bhts", np_features(q, w, kernel), np_features(k, w, kernel))
  if mask is not None:
    a = a * mask[:, None]
  den = a.sum(-1, keepdims=True)
  out = np.einsum("bhts,bshe->bhte", a, np.asarray(v, np.float64)) / np.where(den > 0, den, 1)
  return out.transpose(0, 2, 1, 3)


def np_softmax_attention(q, k, v):
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  s = np.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1])
  p = np.exp(s - s.max(-1, keepdims=True))
  p = p / p.sum(-1, keepdims=True)
  return np.einsum("bhts,bshe->bthe", p, v)


# Jitted: op by op, the causal scan alone takes seconds on a CPU.
favor = jax.jit(performer.favor_attention, static_argnames=("causal", "kernel", "chunk"))
draws = jax.jit(jax.vmap(performer.orthogonal_projection_MxE, in_axes=(0, None, None)),
                static_argnums=(1, 2))
estimate = jax.jit(jax.vmap(lambda q, k, v, w: performer.favor_attention(
    q, k, v, w, causal=False, kernel="softmax"), in_axes=(None, None, None, 0)))


def qkv(batch=2, length=7, heads=2, head_dim=8, seed=0, scale=0.7):
  return (rand((batch, length, heads, head_dim), seed=seed + i, scale=scale) for i in range(3))


def projection(m=24, head_dim=8, seed=0):
  return np.asarray(performer.orthogonal_projection_MxE(jax.random.PRNGKey(seed), m, head_dim))


def test_orthogonal_features_are_orthogonal_blocks_with_chi_norms():
  """Rows within a block of E are mutually orthogonal; row norms are chi(E): mean |w|^2 = E."""
  head_dim = 8
  w = projection(m=4096, head_dim=head_dim, seed=1)
  for block in (w[:head_dim], w[head_dim:2 * head_dim], w[-head_dim:]):
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
  sq_norms = (w ** 2).sum(-1)
  assert abs(sq_norms.mean() - head_dim) < 0.3, sq_norms.mean()  # std of the mean ~0.06
  assert abs(sq_norms.var() - 2 * head_dim) < 3.0, sq_norms.var()  # chi^2_E: variance 2E
  assert not np.allclose(w[:head_dim], w[head_dim:2 * head_dim])  # blocks drawn independently
  # Each row is marginally N(0, I), whatever its place in its block: over the 512 blocks, the
  # i-th rows' mean is 0 (std 1/sqrt(512) ~ 0.044 per coordinate). Householder QR without
  # making R's diagonal positive fails this: its first row always has a negative first entry.
  by_place = w.reshape(-1, head_dim, head_dim).mean(0)  # [place in block, coordinate]
  assert np.abs(by_place).max() < 0.2, by_place


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_bidirectional_favor_equals_the_papers_formula(kernel):
  q, k, v = qkv()
  w = projection()
  got = favor(q, k, v, w, causal=False, kernel=kernel)
  np.testing.assert_allclose(np.asarray(got), np_favor(q, k, v, w, kernel=kernel),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_causal_prefix_sums_equal_the_masked_quadratic_form(kernel):
  q, k, v = qkv(length=9)
  w = projection()
  got = favor(q, k, v, w, causal=True, kernel=kernel)
  mask = np.tril(np.ones((9, 9)))[None].repeat(2, 0)
  np.testing.assert_allclose(np.asarray(got), np_favor(q, k, v, w, mask, kernel),
                             rtol=1e-5, atol=1e-5)


def test_the_causal_form_is_causal_even_when_a_future_key_dwarfs_the_past():
  """Outputs before position 5 do not move when keys/values from 5 on change, also when a new
  future key's exponent exceeds the earlier ones by far more than float32's exp range (a
  sequence-wide key shift, as the reference uses, would underflow the earlier features)."""
  q, k, v = qkv(length=8)
  w = projection()
  before = np.asarray(favor(q, k, v, w, causal=True, kernel="softmax"))
  k2, v2 = k.copy(), v.copy()
  k2[:, 5:] = rand(k2[:, 5:].shape, seed=9) * 40.0  # exponents ~ +-100s
  v2[:, 5:] = rand(v2[:, 5:].shape, seed=10)
  after = np.asarray(favor(q, k2, v2, w, causal=True, kernel="softmax"))
  assert np.all(np.isfinite(after))
  np.testing.assert_allclose(after[:, :5], before[:, :5], rtol=1e-6, atol=1e-7)
  assert not np.allclose(after[:, 5:], before[:, 5:])


def test_gqa_query_heads_share_their_kv_heads_features():
  q, _, _ = qkv(heads=4, seed=3)
  _, k, v = qkv(heads=2, seed=3)
  w = projection()
  got = np.asarray(favor(q, k, v, w, causal=True, kernel="softmax"))
  mask = np.tril(np.ones((7, 7)))[None].repeat(2, 0)
  ref = np_favor(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2), w, mask)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _segments():
  # Row 0: two packed documents then padding; row 1: one document then padding.
  return np.array([[1, 1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("causal", [False, True])
def test_segments_and_padding_drop_out_of_the_sums(causal):
  """Query t sees key s iff same segment, key not padding (and s <= t when causal): the
  quadratic form with tfjax/nn/masks.py's rule; padding queries give 0."""
  seg = _segments()
  q, k, v = qkv(length=9, seed=5)
  k[seg == 0] *= 30.0  # a padding key that counted would swamp the sums
  w = projection()
  got = np.asarray(favor(q, k, v, w, causal=causal, kernel="softmax",
                                             q_segment_ids_BxT=seg, kv_segment_ids_BxS=seg))
  mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
  if causal:
    mask = mask & np.tril(np.ones((9, 9), bool))
  ref = np_favor(q, k, v, w, mask.astype(np.float64)) * (seg != 0)[:, :, None, None]
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_causal_chunks_give_the_masked_quadratic_form_across_chunk_boundaries(chunk):
  """The causal form in chunks of at most `chunk` positions (9 positions: 9 x 1, 5 x 2 with one
  padded position, 3 x 3), segments and padding crossing the chunk boundaries: the quadratic form;
  a future key whose exponent dwarfs the rest by far more than float32's exp range moves no
  earlier output in any chunk."""
  seg = _segments()
  q, k, v = qkv(length=9, seed=5)
  k[seg == 0] *= 30.0
  w = projection()
  run = lambda k_, v_: np.asarray(favor(q, k_, v_, w, causal=True, kernel="softmax",
                                        q_segment_ids_BxT=seg, kv_segment_ids_BxS=seg,
                                        chunk=chunk))
  got = run(k, v)
  mask = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
          & np.tril(np.ones((9, 9), bool)))
  ref = np_favor(q, k, v, w, mask.astype(np.float64)) * (seg != 0)[:, :, None, None]
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  k2, v2 = k.copy(), v.copy()
  k2[:, 4:] = rand(k2[:, 4:].shape, seed=9) * 40.0
  v2[:, 4:] = rand(v2[:, 4:].shape, seed=10)
  after = run(k2, v2)
  assert np.all(np.isfinite(after))
  np.testing.assert_allclose(after[:, :4], got[:, :4], rtol=1e-6, atol=1e-7)


def _largest_array(jaxpr) -> int:
  """Elements of the largest array any equation of `jaxpr` (and its sub-jaxprs) makes."""
  largest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      largest = max(largest, int(np.prod(getattr(var.aval, "shape", ()))))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
          largest = max(largest, _largest_array(getattr(sub, "jaxpr", sub)))
  return largest


def test_the_causal_form_holds_no_sum_per_position():
  """Training's forward and backward pass of the causal form make no [B, L, K, m, E] array (an
  [m, E] sum per position, as the per-position prefix sums did: 4.4 s per layer at the default
  run's shapes on a CPU, docs/attention/performer.md): nothing larger than L m E / 4 here, where
  the features are L m, the chunks' scores L C and their states L m E / C."""
  length, m, head_dim = 130, 32, 8  # 3 chunks of 44
  q, k, v = qkv(batch=1, length=length, heads=1, head_dim=head_dim)
  w = projection(m=m, head_dim=head_dim)
  loss = lambda *qkv_: jnp.sum(performer.favor_attention(*qkv_, w, causal=True,
                                                         kernel="softmax") ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr
  assert _largest_array(jaxpr) <= length * m * head_dim // 4


def test_kv_padding_alone_masks_keys_for_every_query():
  """Cross-attention shape: kv segment ids only (encoder padding), T != S."""
  q, _, _ = qkv(length=5, seed=6)
  _, k, v = qkv(length=9, seed=7)
  kv_seg = _segments()
  w = projection()
  got = np.asarray(favor(q, k, v, w, causal=False, kernel="softmax",
                                             kv_segment_ids_BxS=kv_seg))
  mask = np.broadcast_to((kv_seg != 0)[:, None, :], (2, 5, 9)).astype(np.float64)
  np.testing.assert_allclose(got, np_favor(q, k, v, w, mask), rtol=1e-5, atol=1e-5)


def test_the_estimate_approaches_softmax_attention_at_rate_m_to_the_minus_half():
  """FAVOR+ is unbiased for exp(q.k / sqrt(E)) with variance ~ 1/m, so the attention error falls
  as m^-1/2 (paper, Theorem 1 and Lemma 2): the mean absolute error over 8 draws at m = 16 ...
  1024 fits a log-log slope within [-0.7, -0.3], and is small at m = 1024."""
  # Positive features' variance grows as exp(|q' + k'|^2) (Lemma 2): at scale 0.4 m = 16 is
  # already past it, so the whole range shows the asymptotic rate (at 0.8 it needs m >> 100).
  q, k, v = qkv(batch=1, length=16, heads=2, head_dim=16, seed=11, scale=0.4)
  exact = np_softmax_attention(q, k, v)
  sizes = (16, 64, 256, 1024)
  # The first m rows of a W of 1024 rows are distributed as a W of m rows (whole blocks of E
  # orthonormal rows, independent chi norms): one draw of 8 projections serves every m.
  w_8xMxE = draws(jax.random.split(jax.random.PRNGKey(100), 8), max(sizes), 16)
  errors = [np.abs(np.asarray(estimate(q, k, v, w_8xMxE[:, :m])) - exact).mean() for m in sizes]
  slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
  assert -0.7 <= slope <= -0.3, (slope, errors)
  assert errors[-1] < 0.005, errors


def test_gradients_are_finite_and_match_the_quadratic_form():
  q, k, v = qkv(length=6, seed=12)
  w = projection()
  mask = np.tril(np.ones((6, 6)))[None].repeat(2, 0)
  cot = rand(q.shape, seed=13)

  def loss(q_, k_, v_):
    return jnp.sum(favor(q_, k_, v_, w, causal=True, kernel="softmax") * cot)

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  eps = 1e-4  # central differences of the float64 reference along a random direction
  direction = [rand(a.shape, seed=20 + i) for i, a in enumerate((q, k, v))]
  ref = lambda s: np.sum(np_favor(*(a + s * d for a, d in zip((q, k, v), direction)), w, mask)
                         * cot)
  numeric = (ref(eps) - ref(-eps)) / (2 * eps)
  analytic = sum(np.sum(np.asarray(g) * d) for g, d in zip(grads, direction))
  np.testing.assert_allclose(analytic, numeric, rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# The registered kind: block, redraw, model, counts, training
# ---------------------------------------------------------------------------------------------
def np_block(p, x, w, mask=None):
  """Projections, the paper's estimator with W, output projection: [B, T, D] float64."""
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name]["bias"]
  o = np_favor(proj("query"), proj("key"), proj("value"), w, mask)
  return np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


@pytest.mark.parametrize("causal", [False, True])
def test_the_block_computes_favor_with_its_fixed_projection(causal):
  """MultiHeadAttention of kind 'performer' = the NumPy estimator with the layer's fixed W (the
  seed folded with the module path: () for a module applied on its own)."""
  cfg = tiny_config(attention_kind="performer", position="none", performer_features=12,
                    performer_seed=3)
  module = MultiHeadAttention(cfg, causal=causal)
  x = rand((2, 6, 16))
  params = random_params(module, x, seed=4, scale=0.4)
  y = np.asarray(jax.jit(module.apply)({"params": params}, x))
  w = np.asarray(performer.fixed_projection_MxE(3, (), 12, cfg.dim_per_head))
  mask = np.tril(np.ones((6, 6)))[None].repeat(2, 0) if causal else None
  np.testing.assert_allclose(y, np_block(to_numpy(params), np.asarray(x, np.float64), w, mask),
                             rtol=2e-5, atol=2e-5)


def test_fixed_draws_differ_per_layer_and_seed_and_repeat_exactly():
  draw = lambda seed, path: np.asarray(performer.fixed_projection_MxE(seed, path, 8, 8))
  a = draw(0, ("decoder", "layers_0", "attention"))
  np.testing.assert_array_equal(a, draw(0, ("decoder", "layers_0", "attention")))
  assert not np.allclose(a, draw(0, ("decoder", "layers_1", "attention")))
  assert not np.allclose(a, draw(1, ("decoder", "layers_0", "attention")))


def test_redraw_step_draws_from_the_training_rng_and_eval_uses_the_fixed_draw():
  cfg = tiny_config(attention_kind="performer", position="none", performer_features=8,
                    performer_redraw="step")
  x = rand((1, 5, 16))
  params = random_params(MultiHeadAttention(cfg, causal=True), x, seed=5)
  train = MultiHeadAttention(cfg.replace(deterministic=False), causal=True)
  run = lambda module, **kw: np.asarray(jax.jit(
      lambda p, rngs: module.apply({"params": p}, x, rngs=rngs))(params, kw.get("rngs", {})))
  step_a = run(train, rngs={"dropout": jax.random.PRNGKey(1)})
  np.testing.assert_array_equal(step_a, run(train, rngs={"dropout": jax.random.PRNGKey(1)}))
  assert not np.allclose(step_a, run(train, rngs={"dropout": jax.random.PRNGKey(2)}))
  fixed = run(MultiHeadAttention(cfg.replace(performer_redraw="fixed"), causal=True))
  np.testing.assert_array_equal(run(MultiHeadAttention(cfg, causal=True)), fixed)
  with pytest.raises(ValueError, match="performer_redraw='step'.*'dropout'"):
    train.apply({"params": params}, x)


def test_a_decoder_of_performer_attention_is_causal():
  """Changing tokens from position 5 on leaves the logits before it unchanged (2 layers, RoPE,
  packed-style segment ids absent)."""
  cfg = tiny_config(attention_kind="performer", family="decoder", num_layers=2,
                    position="rope", performer_features=16)
  model = build_model(cfg)
  tokens = np.random.default_rng(0).integers(0, 31, (2, 9)).astype(np.int32)
  params = random_params(model, tokens, seed=6)
  apply = jax.jit(lambda t: model.apply({"params": params}, t))
  changed = tokens.copy()
  changed[:, 5:] = (changed[:, 5:] + 7) % 31
  before, after = np.asarray(apply(tokens)), np.asarray(apply(changed))
  np.testing.assert_allclose(after[:, :5], before[:, :5], rtol=1e-6, atol=1e-6)
  assert not np.allclose(after[:, 5:], before[:, 5:])


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_no_parameters_of_its_own_and_flops_flat_in_the_length(family):
  """W is drawn, not learned: the initialized tree counts exactly softmax's parameters, and the
  analytic count agrees; FLOPs per token are 6N plus the closed form per attention."""
  kw = dict(family=family, num_layers=2, position="none", num_kv_heads=1)
  cfg = tiny_config(attention_kind="performer", performer_features=24, **kw)
  counts = param_accounting.count_by_category(cfg)
  assert counts == param_accounting.count_by_category(tiny_config(**kw))
  assert param_accounting.analytic_count(cfg) == sum(counts.values())
  heads, kv_heads, head_dim, m = 2, 1, 8, 24
  per_attention = 3 * (heads * (4 * m * head_dim + 2 * m) + kv_heads * (4 * m * head_dim + m))
  attentions = {"decoder": 2, "encoder": 2, "encoder_decoder": 6}[family]
  n = param_accounting.analytic_count(cfg) - param_accounting.lookup_only_count(cfg)
  for seq_len in (16, 4096):
    assert flops.flops_per_token(cfg, seq_len) == 6 * n + attentions * per_attention


@pytest.mark.parametrize("overrides,patterns", [
    (dict(window=4), ["model.window=4", "performer", "window=None"]),
    (dict(position="alibi"), ["model.position='alibi'", "performer"]),
    (dict(attention_dropout=0.1), ["model.attention_dropout=0.1", "performer"]),
    (dict(performer_features=0), ["model.performer_features=0", "positive"]),
    (dict(performer_kernel="exp"), ["model.performer_kernel='exp'", "'softmax', 'relu'"]),
    (dict(performer_redraw="always"), ["model.performer_redraw='always'", "'fixed', 'step'"]),
])
def test_rejects_what_the_estimator_cannot_compute(overrides, patterns):
  with pytest.raises(ValueError) as info:
    tiny_config(**{"attention_kind": "performer", "position": "none", **overrides})
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)


@pytest.mark.parametrize("overrides", [
    dict(family="encoder_decoder", position="learned", num_kv_heads=1),
    dict(family="decoder", position="rope", num_layers=2, scan_layers=True, num_kv_heads=1)])
def test_cached_decoding_equals_the_full_forward_pass(overrides):
  """Rows with prompts of 4, 2 and 1 tokens share a left-padded prefill (padding adds no key to
  the running sums), then 6 one-token steps continue the cached (c, S, z): every position
  equals the row's own full forward pass (cross-attention through the encoder's cached keys)."""
  cfg = tiny_config(attention_kind="performer", performer_features=16, **overrides)
  model = build_model(cfg)
  seqs_BxL = np.random.default_rng(1).integers(1, 31, (3, 10)).astype(np.int32)
  enc_BxS = np.random.default_rng(2).integers(1, 31, (3, 5)).astype(np.int32)
  args = (enc_BxS,) if cfg.family == "encoder_decoder" else ()
  params = random_params(model, *args, seqs_BxL, seed=7)
  lengths = (4, 2, 1)

  @jax.jit
  def cached_and_full():
    full_BxLxV = model.apply({"params": params}, *args, seqs_BxL)
    lengths_B = jnp.asarray(lengths)
    pos_BxP, seg_BxP = cached_model.left_padded_positions(lengths_B, 4)
    prompts_BxP = jnp.where(seg_BxP == 1, jnp.take_along_axis(seqs_BxL, pos_BxP, axis=1), 0)
    encoded = cached_model.encode(cfg, params, enc_BxS) if args else None
    cache = cached_model.init_cache(cfg, 3, 10, encoder_len=5 if args else None)
    prefill_BxPxV, cache = cached_model.forward_cached(cfg, params, cache, prompts_BxP, pos_BxP,
                                                       seg_BxP, encoded)

    def step(cache, t):
      pos_Bx1 = (lengths_B + t)[:, None]
      tokens_Bx1 = jnp.take_along_axis(seqs_BxL, pos_Bx1, axis=1)
      logits_Bx1xV, cache = cached_model.forward_cached(cfg, params, cache, tokens_Bx1, pos_Bx1)
      return cache, logits_Bx1xV[:, 0]

    return prefill_BxPxV, jax.lax.scan(step, cache, jnp.arange(6))[1], full_BxLxV

  prefill_BxPxV, steps_NxBxV, full_BxLxV = cached_and_full()
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(prefill_BxPxV[b, 4 - n:], full_BxLxV[b, :n], atol=2e-5)
    np.testing.assert_allclose(steps_NxBxV[:, b], full_BxLxV[b, n:n + 6], atol=2e-5)


def test_performer_trains_through_the_training_loop(tmp_path):
  """train_and_evaluate of a decoder on the copy task with redrawn features: finite losses that
  fall."""
  config = run_helpers.tiny_config(num_steps=12, eval_every=12, checkpoint_every=12)
  config.model.update(attention_kind="performer", performer_features=32,
                      performer_redraw="step")
  config.data.test_lengths = (8,)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  losses = [m["train/loss"] for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  assert len(losses) == 12 and all(np.isfinite(losses))
  assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


def test_the_default_run_trains_performer_on_two_cpu_devices(tmp_path):
  """docs/attention's `python experiments/train.py --config.model.attention_kind=performer` on the
  default run's data-parallel CPU mesh (2 devices here, sizes cut): its gradient is traced inside
  cpu_fusion.summed_over_shards' shard_map, where drawing the fixed projection eagerly failed
  (`assert not hlo_sharding.is_manual()`). Losses finite, the two devices' mesh in the log."""
  small = dict(d_model=32, num_heads=2, d_ff=64, performer_features=32)
  result = run_helpers.run_cli(
      ["--config.model.attention_kind=performer", "--config.mesh.cpu_devices=2",
       f"--workdir={tmp_path / 'run'}", "--config.train.num_steps=2",
       "--config.train.batch_size=8", "--config.train.eval_batch_size=8",
       "--config.train.eval_batches=1", "--config.train.eval_at_start=False",
       "--config.train.log_every=1", "--config.data.test_lengths=(8,)",
       *[f"--config.model.{key}={value}" for key, value in small.items()]],
      cwd=tmp_path, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "over 2 cpu devices" in result.stderr + result.stdout
  losses = run_helpers.train_losses(str(tmp_path / "run"))
  assert sorted(losses) == [1, 2] and all(np.isfinite(list(losses.values()))), losses
