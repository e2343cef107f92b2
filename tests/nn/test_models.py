"""Model-level properties: causality, padding, scan/remat equivalence, positions past training
length, dropout, config validation, and a pairwise-covering matrix of architecture switches."""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_jit, random_params, tiny_config, to_numpy, tokens, unboxed
from np_reference import np_norm
from tfjax.nn.config import FAMILIES, NORMS, PLACEMENTS, POSITIONS, one_of
from tfjax.nn.models import Embedder, build_model, shift_right
from tfjax.nn.positions import has_learned_table


pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


KEY = jax.random.PRNGKey(0)


B, L = 2, 8


def init(cfg, *inputs, seed=0, **kwargs):
  """The model and random (NumPy-drawn) variables: no initializer is compiled."""
  model = build_model(cfg)
  return model, {"params": random_params(model, *inputs, seed=seed, **kwargs)}


def outputs(model, variables, *inputs, **kwargs):
  """The model's main output as a NumPy array (Encoder: its MLM logits, else the hidden states)."""
  out = model.apply(variables, *inputs, **kwargs)
  if isinstance(out, dict):
    out = out["mlm_logits"] if "mlm_logits" in out else out["hidden"]
  return np.asarray(out)


# ------------------------------------------------------------------------------------------------
# Causality
# ------------------------------------------------------------------------------------------------
CAUSAL_CASES = ([("decoder", pos, None) for pos in POSITIONS]
                + [("decoder", pos, 2) for pos in POSITIONS]
                + [("encoder_decoder", pos, None) for pos in POSITIONS]
                + [("encoder_decoder", "rope", 3)])


@pytest.mark.parametrize("family,position,window", CAUSAL_CASES)
def test_causality(family, position, window):
  """Perturbing tokens after t leaves logits at <= t unchanged (and does change later ones)."""
  cfg = tiny_config(family=family, position=position, window=window, num_layers=2)
  t = 3
  dec = np.asarray(tokens((B, L), seed=1))
  perturbed = dec.copy()
  perturbed[:, t + 1:] = (perturbed[:, t + 1:] + 1 + np.arange(L - t - 1)) % 31
  src = tokens((B, 6), seed=2)
  if family == "decoder":
    model, variables = init(cfg, jnp.asarray(dec))
    run = lambda d: outputs(model, variables, jnp.asarray(d))
  else:
    model, variables = init(cfg, src, jnp.asarray(dec))
    run = lambda d: outputs(model, variables, src, jnp.asarray(d))
  base, moved = run(dec), run(perturbed)
  assert base.shape == (B, L, cfg.vocab_size) and np.all(np.isfinite(base))
  np.testing.assert_allclose(moved[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-6)
  assert np.all(np.abs(moved[:, t + 1:] - base[:, t + 1:]).max(-1) > 1e-4)


def test_sliding_window_limits_the_receptive_field():
  """One layer with window 2 and no absolute positions: logits at t see only tokens t-1 and t."""
  cfg = tiny_config(position="none", window=2, num_layers=1)
  dec = np.asarray(tokens((B, L), seed=3))
  model, variables = init(cfg, jnp.asarray(dec))
  base = outputs(model, variables, jnp.asarray(dec))
  perturbed = dec.copy()
  perturbed[:, 2] = (perturbed[:, 2] + 5) % 31
  moved = outputs(model, variables, jnp.asarray(perturbed))
  changed = np.abs(moved - base).max(-1) > 1e-5
  np.testing.assert_array_equal(changed, np.broadcast_to([0, 0, 1, 1, 0, 0, 0, 0], (B, L)))


def test_encoder_decoder_cross_attention_sees_the_whole_source():
  """Source (6) and target (8) lengths differ; every target position depends on every source
  token, including ones after it (cross-attention is not causal)."""
  cfg = tiny_config(family="encoder_decoder", position="sinusoidal", num_decoder_layers=2)
  src = np.asarray(tokens((B, 6), seed=4))
  dec = tokens((B, L), seed=5)
  model, variables = init(cfg, jnp.asarray(src), dec)
  base = outputs(model, variables, jnp.asarray(src), dec)
  assert base.shape == (B, L, cfg.vocab_size)
  for s in (0, 5):
    perturbed = src.copy()
    perturbed[:, s] = (perturbed[:, s] + 7) % 31
    moved = outputs(model, variables, jnp.asarray(perturbed), dec)
    assert np.all(np.abs(moved - base).max(-1) > 1e-5)


# ------------------------------------------------------------------------------------------------
# Padding
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["encoder", "decoder"])
@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_outputs_at_real_positions_ignore_pad_tokens(family, position):
  cfg = tiny_config(family=family, position=position, num_layers=2)
  if family == "encoder":  # right padding
    seg = np.array([[1, 1, 1, 1, 1, 0, 0, 0], [1] * 8])
  else:  # left padding (right padding would be invisible to a causal model anyway)
    seg = np.array([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8])
  real = seg.astype(bool)
  toks = np.asarray(tokens((B, L), seed=6))
  other = np.where(real, toks, (toks + 13) % 31)
  model, variables = init(cfg, jnp.asarray(toks))
  run = lambda x, **kw: outputs(model, variables, jnp.asarray(x), **kw)
  a = run(toks, segment_ids=jnp.asarray(seg))
  b = run(other, segment_ids=jnp.asarray(seg))
  np.testing.assert_allclose(b[real], a[real], rtol=0, atol=1e-6)
  assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
  # Without segment ids the pad tokens are attended to and do change real positions.
  assert not np.allclose(run(toks)[real], run(other)[real], atol=1e-4)


@pytest.mark.parametrize("position", ["sinusoidal", "alibi"])
def test_encoder_decoder_padding(position):
  cfg = tiny_config(family="encoder_decoder", position=position)
  enc_seg = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
  dec_seg = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
  src = np.asarray(tokens((B, 6), seed=7))
  dec = np.asarray(tokens((B, L), seed=8))
  src2 = np.where(enc_seg > 0, src, (src + 11) % 31)
  dec2 = np.where(dec_seg > 0, dec, (dec + 11) % 31)
  model, variables = init(cfg, jnp.asarray(src), jnp.asarray(dec))

  def run(s, d, **kw):
    kw = {k: jnp.asarray(v) for k, v in kw.items()}
    return outputs(model, variables, jnp.asarray(s), jnp.asarray(d), **kw)

  # Encoder padding only: every decoder position ignores the encoder's pad tokens.
  a = run(src, dec, encoder_segment_ids=enc_seg)
  np.testing.assert_allclose(run(src2, dec, encoder_segment_ids=enc_seg), a, rtol=0, atol=1e-6)
  assert not np.allclose(run(src2, dec), run(src, dec), atol=1e-4)
  # Both sides padded: real decoder positions ignore pad tokens on either side.
  both = dict(encoder_segment_ids=enc_seg, decoder_segment_ids=dec_seg)
  real = dec_seg.astype(bool)
  a = run(src, dec, **both)
  b = run(src2, dec2, **both)
  np.testing.assert_allclose(b[real], a[real], rtol=0, atol=1e-6)
  assert np.all(np.isfinite(b))


# ------------------------------------------------------------------------------------------------
# ALiBi in the encoder is bidirectional and symmetric
# ------------------------------------------------------------------------------------------------
def test_encoder_alibi_is_symmetric_bidirectional():
  cfg = tiny_config(family="encoder", position="alibi", num_heads=4)
  toks = tokens((B, L), seed=9)
  model, variables = init(cfg, toks)
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  query = params["encoder"]["layers_0"]["self_attention"]["query"]
  # Zero queries: the logits are exactly the ALiBi bias, -m |i - j|.
  query["kernel"] = jnp.zeros_like(query["kernel"])
  query["bias"] = jnp.zeros_like(query["bias"])
  _, state = model.apply({"params": params}, toks, mutable=["intermediates"])
  (weights,) = state["intermediates"]["encoder"]["layers_0"]["self_attention"][
      "attention_weights"]
  weights = np.asarray(weights)[0]  # [H, L, L]
  i, j = np.arange(L)[:, None], np.arange(L)[None, :]
  for h, m in enumerate([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]):
    logits = -m * np.abs(i - j)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(weights[h], expected, rtol=1e-5, atol=1e-7)
  # Bidirectional: keys after the query get weight; symmetric: equal distance, equal weight.
  assert np.all(weights[:, 3, 4:] > 0)
  np.testing.assert_allclose(weights[:, 3, 4:7], weights[:, 3, 0:3][:, ::-1], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Positions past the training length
# ------------------------------------------------------------------------------------------------
def test_learned_positions_past_the_table_raise():
  cfg = tiny_config(position="learned", max_len=8)
  model, variables = init(cfg, tokens((B, 8)))
  assert np.all(np.isfinite(outputs(model, variables, tokens((B, 8)))))
  with pytest.raises(ValueError, match=r"sequence length 9 exceeds the learned position table "
                                       r"\(model.max_len=8\)"):
    model.apply(variables, tokens((B, 9)))
  ed = tiny_config(family="encoder_decoder", position="learned", max_len=8)
  model, variables = init(ed, tokens((B, 6)), tokens((B, 8)))
  with pytest.raises(ValueError, match="max_len=8"):
    model.apply(variables, tokens((B, 6)), tokens((B, 12)))


@pytest.mark.parametrize("position", ["sinusoidal", "rope", "rope_interleaved", "alibi", "none"])
def test_relative_and_fixed_positions_run_at_four_times_training_length(position):
  cfg = tiny_config(position=position, max_len=8)
  model, variables = init(cfg, tokens((B, 8)))
  long = tokens((B, 32), seed=10)
  logits = outputs(model, variables, long)
  assert logits.shape == (2, 32, cfg.vocab_size) and np.all(np.isfinite(logits))


def test_bfloat16_compute_tracks_float32():
  """dtype=bfloat16 (LLaMA's config) computes in bf16 with float32 params and float32 logits."""
  cfg = tiny_config(position="rope", norm="rmsnorm", ffn="swiglu")
  toks = tokens((B, L), seed=14)
  model, variables = init(cfg, toks)
  ref = outputs(model, variables, toks)
  low = outputs(build_model(cfg.replace(dtype="bfloat16")), variables, toks)
  assert low.dtype == np.float32
  scale = np.abs(ref).max()
  np.testing.assert_allclose(low, ref, atol=0.05 * scale)
  assert not np.array_equal(low, ref)  # bf16 really was used


# ------------------------------------------------------------------------------------------------
# Scan vs unscanned, remat
# ------------------------------------------------------------------------------------------------
def _inputs(family):
  dec = tokens((B, L), seed=11)
  seg = jnp.asarray([[1, 1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 1, 1, 0]])
  if family == "decoder":
    return (dec,), dict(segment_ids=seg)
  if family == "encoder":
    return (dec,), dict(segment_ids=seg)
  src = tokens((B, 6), seed=12)
  return (src, dec), dict(encoder_segment_ids=jnp.asarray([[1, 1, 1, 1, 0, 0], [1] * 6]))


def _stack_layers(params, stacks, num):
  """Unscanned params {stack: {layers_i: p_i}} -> scanned {stack: {layers: {layer: stack(p_i)}}}."""
  params = dict(params)
  for stack, n in zip(stacks, num):
    sub = dict(params[stack])
    layers = [sub.pop(f"layers_{i}") for i in range(n)]
    sub["layers"] = {"layer": jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers)}
    params[stack] = sub
  return params


SCAN_FAMILIES = {
    "decoder": (dict(position="rope", num_layers=3), ("decoder",)),
    "encoder": (dict(position="learned", num_layers=2, pooler=True, num_classes=3),
                ("encoder",)),
    "encoder_decoder": (dict(position="alibi", num_layers=2, num_decoder_layers=3,
                             norm_placement="post"), ("encoder", "decoder")),
}


@pytest.mark.parametrize("family", list(SCAN_FAMILIES))
def test_scan_matches_unscanned_with_the_same_weights(family):
  overrides, stacks = SCAN_FAMILIES[family]
  cfg = tiny_config(family=family, **overrides)
  args, kwargs = _inputs(family)
  model, variables = init(cfg, *args, **kwargs)
  scanned_cfg = cfg.replace(scan_layers=True)
  scanned_model, scanned_vars = init(scanned_cfg, *args, **kwargs)
  num = (cfg.num_layers, cfg.decoder_layers)[:len(stacks)] if len(stacks) == 2 else (
      cfg.num_layers,)
  stacked = _stack_layers(variables["params"], stacks, num)
  # The mapping reproduces the scanned model's own parameter layout exactly.
  shapes = lambda t: jax.tree_util.tree_map(np.shape, t)
  assert shapes(stacked) == shapes(scanned_vars["params"])
  out = model.apply(variables, *args, **kwargs)
  scanned_out = fast_jit(lambda p: scanned_model.apply({"params": p}, *args, **kwargs))(stacked)
  for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(scanned_out)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
  # Layers differ from each other, so a wrong stacking order would show.
  first = variables["params"][stacks[-1]]["layers_0"]["self_attention"]["query"]["kernel"]
  second = variables["params"][stacks[-1]]["layers_1"]["self_attention"]["query"]["kernel"]
  assert not np.allclose(np.asarray(first), np.asarray(second))


def _loss_and_grads(model, params, args, kwargs):
  def step(p):
    def loss(p):
      out = model.apply({"params": p}, *args, **kwargs)
      out = out["mlm_logits"] if isinstance(out, dict) else out
      return jnp.mean(jnp.square(out)), out
    return jax.value_and_grad(loss, has_aux=True)(p)
  (_, out), grads = fast_jit(step)(params)
  return np.asarray(out), grads


def test_remat_gives_identical_outputs_and_gradients():
  """remat full/dots, unscanned and scanned, against the plain unscanned model (the scanned run
  gets the same weights stacked; its gradients are compared with the stacked reference ones)."""
  cfg = tiny_config(num_layers=2, position="rope")
  args, kwargs = _inputs("decoder")
  model, variables = init(cfg, *args, **kwargs)
  params = variables["params"]
  ref_out, ref_grads = _loss_and_grads(model, params, args, kwargs)
  assert all(np.abs(np.asarray(g)).sum() > 0 for path, g in
             jax.tree_util.tree_flatten_with_path(ref_grads)[0] if "kernel" in str(path))
  stack = lambda tree: _stack_layers(tree, ("decoder",), (2,))
  for scan, remat in [(False, "full"), (False, "dots"), (True, "full")]:
    rm = build_model(cfg.replace(scan_layers=scan, remat=remat))
    p, expected = (stack(params), stack(ref_grads)) if scan else (params, ref_grads)
    out, grads = _loss_and_grads(rm, p, args, kwargs)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(expected)
    jax.tree_util.tree_map(lambda g, r: np.testing.assert_allclose(
        np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6), grads, expected)


def test_remat_passes_cross_attention_inputs_through():
  cfg = tiny_config(family="encoder_decoder", position="alibi")
  args, kwargs = _inputs("encoder_decoder")
  model, variables = init(cfg, *args, **kwargs)
  ref = outputs(model, variables, *args, **kwargs)
  out = outputs(build_model(cfg.replace(remat="full")), variables, *args, **kwargs)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,rates", [
    ("decoder", (0.2, 0.0)), ("decoder", (0.0, 0.3)), ("encoder", (0.2, 0.0)),
    ("encoder_decoder", (0.0, 0.3)),
])
def test_dropout_depends_on_rng_only_when_not_deterministic(family, rates):
  dropout, attention_dropout = rates
  cfg = tiny_config(family=family, dropout=dropout, attention_dropout=attention_dropout)
  args, kwargs = _inputs(family)
  model, variables = init(cfg, *args, **kwargs)
  train = build_model(cfg.replace(deterministic=False))
  # rbg keys: same semantics, but eager dropout masks compile in a fraction of threefry's time.
  run = lambda m, seed: outputs(m, variables, *args,
                                rngs={"dropout": jax.random.key(seed, impl="rbg")}, **kwargs)
  a, b, a_again = run(train, 1), run(train, 2), run(train, 1)
  np.testing.assert_array_equal(a, a_again)
  assert not np.allclose(a, b, atol=1e-5)
  eval_out = outputs(model, variables, *args, **kwargs)
  np.testing.assert_array_equal(run(model, 1), eval_out)
  np.testing.assert_array_equal(run(model, 2), eval_out)
  assert not np.allclose(a, eval_out, atol=1e-5)


def test_attention_dropout_with_a_fused_implementation_raises(monkeypatch):
  import tfjax.nn.kernels  # pylint: disable=import-outside-toplevel
  calls = []
  monkeypatch.setitem(tfjax.nn.kernels.IMPLEMENTATIONS, "chunked", lambda *a, **k: calls.append(1))
  cfg = tiny_config(attention_dropout=0.1, attention_impl="chunked", deterministic=False)
  model, variables = init(cfg.replace(deterministic=True, attention_impl="xla"), tokens((1, 4)))
  with pytest.raises(ValueError, match="attention dropout is only supported by implementation="
                                       "'xla' or 'pallas', not 'chunked'"):
    build_model(cfg).apply(variables, tokens((1, 4)), rngs={"dropout": KEY})
  assert not calls


# ------------------------------------------------------------------------------------------------
# Config validation
# ------------------------------------------------------------------------------------------------
def test_one_of_returns_the_value_or_names_the_choices():
  assert one_of("strategy", "beam", ("greedy", "beam")) == "beam"
  with pytest.raises(ValueError, match=r"^strategy='bean' is invalid; choose one of "
                                       r"\('greedy', 'beam'\); did you mean 'beam'\?$"):
    one_of("strategy", "bean", ["greedy", "beam"])


def test_only_the_learned_position_table_has_a_table():
  assert [p for p in POSITIONS if has_learned_table(tiny_config(position=p))] == ["learned"]


def test_shift_right():
  np.testing.assert_array_equal(np.asarray(shift_right(jnp.array([[5, 6, 7], [8, 9, 10]]), 1)),
                                [[1, 5, 6], [1, 8, 9]])


def test_encoder_pooler_and_classifier_match_numpy():
  cfg = tiny_config(family="encoder", pooler=True, num_classes=3, type_vocab_size=2)
  toks = tokens((B, L), seed=13)
  model, variables = init(cfg, toks)
  out = model.apply(variables, toks, token_type_ids=jnp.ones_like(toks))
  assert set(out) == {"hidden", "mlm_logits", "pooled", "class_logits"}
  p = to_numpy(variables["params"])
  h = np.asarray(out["hidden"], np.float64)
  pooled = np.tanh(h[:, 0] @ p["pooler"]["kernel"] + p["pooler"]["bias"])
  np.testing.assert_allclose(np.asarray(out["pooled"]), pooled, rtol=1e-5, atol=1e-6)
  logits = pooled @ p["classifier"]["kernel"] + p["classifier"]["bias"]
  np.testing.assert_allclose(np.asarray(out["class_logits"]), logits, rtol=1e-5, atol=1e-5)
  assert out["mlm_logits"].shape == (B, L, cfg.vocab_size)


# ------------------------------------------------------------------------------------------------
# Architecture matrix: every pair of axis values appears in at least one case
# ------------------------------------------------------------------------------------------------
# The FFN axis keeps one activation per structure (two-matrix, gated; relu/gelu/silu kinds): the
# other activations differ only elementwise (tests/nn/test_ffn.py) and would double the row count.
AXES = dict(family=FAMILIES, position=POSITIONS, norm=NORMS, norm_placement=PLACEMENTS,
            ffn=("relu", "gelu", "swiglu", "geglu"))


def pairwise_cases(axes):
  """Deterministic pairwise covering design: one row per value pair of the two largest axes
  (the lower bound on the row count), the other axes chosen greedily to cover the most
  still-uncovered pairs (ties: least used values), then extra rows for anything left."""
  names = list(axes)
  pairs = lambda row: {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}
  candidates = [dict(zip(names, values)) for values in itertools.product(*axes.values())]
  uncovered = set().union(*(pairs(r) for r in candidates))
  big = sorted(names, key=lambda n: -len(axes[n]))[:2]
  usage = collections.Counter()
  rows = []

  def take(options):
    best = max(options, key=lambda r: (len(pairs(r) & uncovered),
                                       -sum(usage[(n, r[n])] for n in names)))
    rows.append(best)
    usage.update((n, best[n]) for n in names)
    uncovered.difference_update(pairs(best))

  for a, b in itertools.product(axes[big[0]], axes[big[1]]):
    take([r for r in candidates if r[big[0]] == a and r[big[1]] == b])
  while uncovered:
    take(candidates)
  return rows


MATRIX = pairwise_cases(AXES)


assert len(MATRIX) <= 30


def _matrix_id(row):
  return "-".join(str(v) for v in row.values())


@pytest.mark.parametrize("index", range(len(MATRIX)), ids=[_matrix_id(r) for r in MATRIX])
def test_architecture_matrix_init_forward_grad_finite(index):
  row = MATRIX[index]
  extra = dict(num_layers=2 if index % 8 == 0 else 1, num_kv_heads=1 if index % 3 == 0 else None)
  if row["family"] != "encoder" and index % 4 == 1:
    extra["window"] = 3
  cfg = tiny_config(**row, **extra, d_ff=16)
  model = build_model(cfg)
  toks = tokens((1, 6), seed=index)
  args = (toks, toks[:, :5]) if cfg.family == "encoder_decoder" else (toks,)

  @fast_jit
  def step(key):
    params = unboxed(model.init(key, *args))["params"]

    def loss(p):
      out = model.apply({"params": p}, *args)
      out = out["mlm_logits"] if isinstance(out, dict) else out
      return jnp.mean(jax.nn.logsumexp(out, -1) - out[..., 0]), out
    (value, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, out, grads

  value, out, grads = step(KEY)
  assert out.shape == (1, args[-1].shape[1], cfg.vocab_size)
  assert np.isfinite(float(value))
  assert np.all(np.isfinite(np.asarray(out)))
  leaves = [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]
  assert all(np.all(np.isfinite(g)) for g in leaves)
  assert sum(float(np.abs(g).sum()) for g in leaves) > 0


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_logits_softcap_is_cap_tanh_of_the_logits(family):
  """Gemma 2: final logits cap * tanh(logits / cap), on the same weights."""
  cfg = tiny_config(family=family)
  toks = tokens((1, 5), seed=1)
  args = (toks, toks) if family == "encoder_decoder" else (toks,)
  model, variables = init(cfg, *args, scale=1.0)
  plain = outputs(model, variables, *args)
  capped = outputs(build_model(cfg.replace(logits_softcap=1.5)), variables, *args)
  assert np.abs(plain).max() > 1.5  # the cap binds
  np.testing.assert_allclose(capped, 1.5 * np.tanh(plain / 1.5), rtol=1e-5, atol=1e-6)


def test_scale_tied_logits_rescales_the_tied_head_input():
  """T5 v1.0: logits = (h * d_model^-0.5) E^T; the head is linear, so logits scale alike."""
  cfg = tiny_config(family="encoder_decoder", position="t5_bias")
  toks = tokens((1, 5), seed=2)
  model, variables = init(cfg, toks, toks)
  plain = outputs(model, variables, toks, toks)
  scaled = outputs(build_model(cfg.replace(scale_tied_logits=True)), variables, toks, toks)
  np.testing.assert_allclose(scaled, plain * 16 ** -0.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,overrides", [
    ("bart", dict(share_positions=False, embed_norm=True, position_offset=2,
                  final_logits_bias=True, embed_scale=True)),
    ("marian_separate", dict(share_embeddings=False, position="sinusoidal",
                             sinusoid_layout="halves", final_logits_bias=True)),
])
def test_encoder_decoder_embedding_sharing_switches(name, overrides):
  """Each side reads its own tables: encoding (decoding) equals a default shared-embedding model
  given the encoder's (decoder's) tables; final_logits_bias adds to the logits."""
  cfg = tiny_config(family="encoder_decoder", **overrides)
  ref = build_model(cfg.replace(share_embeddings=True, share_positions=None, position_offset=0,
                                final_logits_bias=False))
  src, tgt = tokens((2, 5), seed=3), tokens((2, 4), seed=4)
  model, variables = init(cfg, src, tgt)
  p = variables["params"]
  assert ("shared" in p) == (name == "bart") and "embed" not in p

  def side(which):
    own = dict(p[f"{which}_embed"])
    if name == "bart":
      own["tokens"] = p["shared"]
      own["positions"] = {"embedding": own["positions"]["embedding"][2:]}
    return {"params": {"embed": own, "encoder": p["encoder"], "decoder": p["decoder"]}}

  encoded = model.apply(variables, src, method="encode")
  np.testing.assert_allclose(np.asarray(encoded),
                             np.asarray(ref.apply(side("encoder"), src, method="encode")),
                             rtol=1e-5, atol=1e-5)
  logits = model.apply(variables, encoded, tgt, method="decode")
  expected = ref.apply(side("decoder"), encoded, tgt, method="decode")
  bias = np.asarray(unboxed(p["final_logits_bias"]))
  assert np.abs(bias).max() > 0
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected) + bias, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_embed_scale_with_position_init_std_balances_tokens_and_positions(position):
  """The position ablation's setting (configs/ablations/_char_lm.py): sqrt(d_model)-scaled tokens
  (table std d^-0.5, so unit RMS) and a position signal of RMS 2^-0.5 (the sinusoid's; a learned
  table of that std) start at comparable norms. The defaults do not: tokens N(0, 0.02^2) are ~35x
  weaker than the sinusoid table (the issue's 0.16 vs 5.7 at d_model 64)."""
  from tfjax.nn.models import Embedder  # pylint: disable=import-outside-toplevel

  def rms_ratio(**overrides):  # RMS(position part) / RMS(token part) of the embedder output
    cfg = tiny_config(d_model=64, vocab_size=101, max_len=64, position=position, **overrides)
    ids = tokens((1, 64), vocab=101)
    positions = jnp.arange(64)[None]
    embedder = Embedder(cfg)
    variables = embedder.init(KEY, ids, positions)
    out = np.asarray(embedder.apply(variables, ids, positions))
    table = np.asarray(unboxed(variables)["params"]["tokens"]["embedding"])
    token_part = table[np.asarray(ids)] * (np.sqrt(64) if cfg.embed_scale else 1.0)
    rms = lambda a: np.sqrt(np.mean(a ** 2))  # noqa: E731
    return rms(out - token_part) / rms(token_part), rms(token_part)

  ratio, token_rms = rms_ratio(embed_scale=True, position_init_std=2 ** -0.5, init_std=0.02)
  np.testing.assert_allclose(token_rms, 1.0, rtol=0.1)
  np.testing.assert_allclose(ratio, 2 ** -0.5, rtol=0.15)
  if position == "sinusoidal":
    assert rms_ratio(init_std=0.02)[0] > 25


# ------------------------------------------------------------------------------------------------
# Embedder
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [
    dict(position="learned"),
    dict(position="sinusoidal", embed_scale=True),
    dict(position="rope"),
    dict(family="encoder", position="learned", type_vocab_size=2, embed_norm=True),
])
def test_embedder_matches_numpy(overrides):
  cfg = tiny_config(**overrides)
  toks = np.array([[1, 5, 30, 2], [0, 7, 7, 9]])
  positions = np.array([[0, 1, 2, 3], [3, 4, 5, 6]])
  types = np.array([[0, 0, 1, 1], [1, 0, 1, 0]])
  module = Embedder(cfg)
  args = (jnp.asarray(toks), jnp.asarray(positions))
  kwargs = dict(token_type_ids=jnp.asarray(types)) if cfg.type_vocab_size else {}
  params = random_params(module, *args, seed=9, scale=0.5, **kwargs)
  p = to_numpy(params)
  y = np.asarray(module.apply({"params": params}, *args, **kwargs))
  x = p["tokens"]["embedding"][toks] * (np.sqrt(16) if cfg.embed_scale else 1.0)
  if cfg.positions.kind == "learned":
    x = x + p["positions"]["embedding"][positions]
  if cfg.positions.kind == "sinusoidal":
    i = np.arange(8)
    angles = positions[..., None] / 10000.0 ** (2 * i / 16)
    x = x + np.stack([np.sin(angles), np.cos(angles)], -1).reshape(2, 4, 16)
  if cfg.type_vocab_size:
    x = x + p["token_types"]["embedding"][types]
  if cfg.embed_norm:
    x = np_norm(x, p["norm"], "layernorm", cfg.norms.eps)
  np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)


def test_bf16_token_table_gradient_accumulates_in_float32():
  """The lookup gathers rows of the float32 table and casts them, so the gradient's scatter-add
  (one row per token, many tokens per id) runs in float32 in the program handed to any backend's
  compiler; casting the table first would make it a bfloat16 scatter (the CPU compiler happens to
  widen it again, a GPU's does not)."""
  import re  # pylint: disable=import-outside-toplevel
  from tfjax.nn import models as model_lib  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from tfjax.training.config import defaults  # pylint: disable=import-outside-toplevel
  config = defaults.base_config().model
  config.update(dtype="bfloat16", vocab_size=300, d_model=32, num_layers=1, num_heads=2, d_ff=64,
                position="rope")
  model = model_lib.build_model(ModelConfig.from_config(config))
  ids = jnp.zeros((2, 8), jnp.int32)
  # Lowering needs shapes only: no initializer runs (run eagerly, they took most of the time).
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
  loss = lambda p: model.apply(p, ids).astype(jnp.float32).sum()
  lowered = jax.jit(jax.grad(loss)).lower(params).as_text()
  scatters = re.findall(r'"stablehlo.scatter".*?\) -> (tensor<[^>]*>)', lowered, re.S)
  assert scatters == ["tensor<300x32xf32>"], scatters
