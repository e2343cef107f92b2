"""tfjax/nn/positions.py: RoPE frequency scalings and partial rotary against their published
formulas, written here in NumPy in the papers' / reference code's per-frequency form."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_owner_rejects, tiny_config
from np_reference import np_rope, rand

from tfjax.nn import positions
from tfjax.nn.config import POSITIONS
from tfjax.nn.positions import alibi_slopes, apply_rope, sinusoidal_table

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


def np_inv_freq(dim, base):
  return np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)])


def np_llama3(inv_freq, factor, low, high, old_context):
  """Meta's Llama 3.1 `apply_scaling`, frequency by frequency."""
  out = []
  for f in inv_freq:
    wavelen = 2 * math.pi / f
    if wavelen < old_context / high:
      out.append(f)
    elif wavelen > old_context / low:
      out.append(f / factor)
    else:
      smooth = (old_context / wavelen - low) / (high - low)
      out.append((1 - smooth) * f / factor + smooth * f)
  return np.array(out)


def test_llama3_frequencies_are_meta_reference_for_llama31_8b():
  """Llama 3.1: head_dim 128, theta 500000, factor 8, low 1, high 4, original context 8192."""
  inv_freq = np_inv_freq(128, 500000.0)
  got = np.asarray(positions.llama3_scaled_frequencies(
      jnp.asarray(inv_freq, jnp.float32), 8.0, 1.0, 4.0, 8192))
  expected = np_llama3(inv_freq, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(got, expected, rtol=2e-6)
  wavelen = 2 * math.pi / inv_freq
  assert np.all(got[wavelen < 2048] == np.float32(inv_freq[wavelen < 2048]))  # kept
  np.testing.assert_allclose(got[wavelen > 8192], inv_freq[wavelen > 8192] / 8, rtol=2e-6)
  assert 0 < np.sum((wavelen >= 2048) & (wavelen <= 8192)) < 64  # a blended band exists


def np_yarn(dim, base, factor, orig, beta_fast, beta_slow):
  """Peng et al. 2023 (YaRN), section 3.2 'NTK-by-parts' and the reference code's ramp."""
  def dim_of(rotations):  # the dimension making `rotations` turns over the original context
    return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
  low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), dim - 1)
  out = []
  for i, f in enumerate(np_inv_freq(dim, base)):
    ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
    out.append(f / factor * ramp + f * (1 - ramp))
  return np.array(out)


@pytest.mark.parametrize("dim,base,factor,orig", [(128, 10000.0, 4.0, 4096),
                                                  (64, 1e6, 16.0, 32768)])
def test_yarn_frequencies_and_attention_factor(dim, base, factor, orig):
  got = np.asarray(positions.yarn_scaled_frequencies(dim, base, factor, orig, 32.0, 1.0))
  np.testing.assert_allclose(got, np_yarn(dim, base, factor, orig, 32.0, 1.0), rtol=2e-6)
  inv_freq = np_inv_freq(dim, base)
  assert got[0] == pytest.approx(inv_freq[0], rel=1e-6)  # fastest dims extrapolate
  assert got[-1] == pytest.approx(inv_freq[-1] / factor, rel=1e-5)  # slowest interpolate
  # Published default: sqrt(1/t) = 0.1 ln(s) + 1 on the attention logits' temperature.
  assert positions.yarn_attention_factor(factor) == pytest.approx(0.1 * math.log(factor) + 1)
  assert positions.yarn_attention_factor(4.0) == pytest.approx(1.1386294)


def test_dynamic_ntk_base_formula():
  base, dim, factor, orig = 10000.0, 64, 2.0, 16
  for seq_len in (4, 16):  # within the trained context: unchanged
    assert float(positions.dynamic_ntk_base(base, dim, factor, orig, seq_len)) == base
  expected = base * (factor * 40 / orig - (factor - 1)) ** (dim / (dim - 2))
  assert float(positions.dynamic_ntk_base(base, dim, factor, orig, 40)) == pytest.approx(
      expected, rel=1e-6)


def test_scaled_rope_frequencies_per_config():
  pos = jnp.arange(40)[None]
  cfg = tiny_config(position="rope", head_dim=16, rope_scaling="linear", rope_scaling_factor=4.0)
  inv, gain = positions.scaled_rope_frequencies(cfg, pos)
  np.testing.assert_allclose(np.asarray(inv), np_inv_freq(16, 1e4) / 4, rtol=2e-6)
  assert gain == 1.0
  cfg = tiny_config(position="rope", head_dim=16, rope_scaling="dynamic", rope_scaling_factor=2.0,
                    rope_original_max_len=16)
  inv, _ = positions.scaled_rope_frequencies(cfg, pos)  # seq_len 40 from the positions
  new_base = 1e4 * (2.0 * 40 / 16 - 1.0) ** (16 / 14)
  np.testing.assert_allclose(np.asarray(inv), np_inv_freq(16, new_base), rtol=2e-5)
  cfg = tiny_config(position="rope", head_dim=16, rope_scaling="yarn", rope_scaling_factor=4.0,
                    rope_original_max_len=16, rope_attention_factor=1.5)
  assert positions.scaled_rope_frequencies(cfg, pos)[1] == 1.5
  cfg = tiny_config(position="rope", head_dim=16, rotary_fraction=0.5)
  inv, _ = positions.scaled_rope_frequencies(cfg, pos)
  np.testing.assert_allclose(np.asarray(inv), np_inv_freq(8, 1e4), rtol=2e-6)  # base^(-2i/R)


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_rotates_only_the_first_channels(interleaved):
  x = np.random.default_rng(0).normal(size=(1, 5, 2, 12)).astype(np.float32)
  pos = jnp.arange(5)[None]
  y = np.asarray(positions.apply_rope(jnp.asarray(x), pos, rotary_dim=4, interleaved=interleaved))
  np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
  full = np.asarray(positions.apply_rope(jnp.asarray(x[..., :4]), pos, interleaved=interleaved))
  np.testing.assert_allclose(y[..., :4], full, rtol=1e-6, atol=1e-6)
  # Linear scaling: frequencies / s at position s * p rotate as the original at p.
  scaled = positions.apply_rope(jnp.asarray(x), pos * 3, rotary_dim=4, interleaved=interleaved,
                                inv_freq=positions.rope_frequencies(4, 1e4) / 3)
  np.testing.assert_allclose(np.asarray(scaled), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides,match", [
    (dict(rope_scaling="linear", rope_scaling_factor=2.0), "set model.position='rope'"),
    (dict(position="rope", rope_scaling="ntk"), "model.rope_scaling='ntk' is invalid"),
    (dict(position="rope", rope_scaling="yarn", rope_scaling_factor=2.0),
     "needs model.rope_original_max_len"),
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=0.5), "must be >= 1"),
    (dict(position="rope", rope_low_freq_factor=2.0), "only read by model.rope_scaling"),
    (dict(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0,
          rope_original_max_len=16, rope_low_freq_factor=4.0), "below model.rope_high"),
    (dict(position="rope", rotary_fraction=1.5), "must be in \\(0, 1\\]"),
    (dict(position="rope", rotary_fraction=0.1), "even, nonzero"),
    (dict(position="alibi", rotary_fraction=0.5), "partial RoPE"),
])
def test_rope_keys_are_validated(overrides, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**overrides)


def test_sinusoid_halves_layout_is_marians_table():
  """HF Marian/Pegasus: out[:, :d/2] = sin(p / 10000^(2i/d)), out[:, d/2:] = cos(same)."""
  d, length = 10, 7
  angle = np.array([[p / 10000 ** (2 * (j // 2) / d) for j in range(d)] for p in range(length)])
  expected = np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)
  got = positions.sinusoidal_table(jnp.arange(length)[None], d, "halves")[0]
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
  interleaved = np.asarray(positions.sinusoidal_table(jnp.arange(length)[None], d)[0])
  np.testing.assert_allclose(interleaved[:, 0::2], expected[:, :5], rtol=1e-5, atol=1e-5)


def test_learned_positions_with_offset_read_row_p_plus_offset():
  """BART: a table of max_len + 2 rows, position p reads row p + 2."""
  cfg = tiny_config(position_offset=2, max_len=6)
  module = positions.LearnedPositions(cfg)
  table = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
  pos = jnp.array([[0, 1, 5]])
  got = module.apply({"params": {"embedding": table}}, pos, 3)
  np.testing.assert_array_equal(np.asarray(got)[0], table[[2, 3, 7]])
  for overrides in (dict(position="rope", position_offset=2), dict(position_offset=-1),
                    dict(sinusoid_layout="halves")):
    with pytest.raises(ValueError, match="position_offset|sinusoid_layout"):
      tiny_config(**overrides)


# ------------------------------------------------------------------------------------------------
# Positions
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [16, 6])
def test_sinusoidal_table_is_the_formula(d_model):
  positions = np.array([[0, 1, 2, 3, 50], [7, 100, 999, 5, 4096]])
  table = np.asarray(sinusoidal_table(jnp.asarray(positions), d_model))
  assert table.shape == (2, 5, d_model)
  expected = np.zeros((2, 5, d_model))
  for b in range(2):
    for l in range(5):
      p = positions[b, l]
      for i in range(d_model // 2):
        expected[b, l, 2 * i] = math.sin(p / 10000 ** (2 * i / d_model))
        expected[b, l, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d_model))
  # float32 angles of up to ~4096 rad: absolute error ~ 4096 * 2^-24
  np.testing.assert_allclose(table, expected, atol=1e-3)
  small = positions <= 100
  np.testing.assert_allclose(table[small], expected[small], atol=5e-6)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_rotation_matrices(interleaved, base):
  x = rand((2, 4, 3, 8), seed=4)
  positions = np.array([[0, 1, 2, 3], [5, 9, 17, 60]])
  y = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(positions), base=base,
                            interleaved=interleaved))
  np.testing.assert_allclose(y, np_rope(x, positions, base, interleaved), rtol=1e-5, atol=1e-5)
  # The other pairing is a different function (so the check above tells them apart).
  assert not np.allclose(y, np_rope(x, positions, base, not interleaved), atol=1e-3)
  # Rotations preserve norms; position 0 is the identity.
  np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(y[0, 0], x[0, 0], rtol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_offset(interleaved):
  """q(p)·k(p') after rotation is a function of p - p': shifting every position by c keeps it."""
  q = rand((1, 6, 2, 8), seed=5)
  k = rand((1, 6, 2, 8), seed=6)
  q_pos = np.array([[0, 1, 2, 3, 4, 5]])
  k_pos = np.array([[3, 0, 5, 1, 4, 2]])

  def scores(shift):
    rq = apply_rope(jnp.asarray(q), jnp.asarray(q_pos + shift), interleaved=interleaved)
    rk = apply_rope(jnp.asarray(k), jnp.asarray(k_pos + shift), interleaved=interleaved)
    return np.einsum("bthd,bshd->bhts", np.asarray(rq, np.float64), np.asarray(rk, np.float64))

  base = scores(0)
  for shift in (1, 7, 113):
    np.testing.assert_allclose(scores(shift), base, rtol=1e-4, atol=1e-4)
  # ... and they do depend on the offset: unrotated scores are different.
  plain = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64))
  assert not np.allclose(base, plain, atol=1e-2)


def test_alibi_slopes_published_values():
  np.testing.assert_array_equal(alibi_slopes(8), [2.0 ** -h for h in range(1, 9)])
  np.testing.assert_array_equal(alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
  np.testing.assert_array_equal(alibi_slopes(4), [1 / 4, 1 / 16, 1 / 64, 1 / 256])
  np.testing.assert_array_equal(alibi_slopes(1), [2.0 ** -8])
  # 12 heads (Press et al. reference code): 8-head slopes, then every other slope of 16 heads.
  expected12 = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -(h / 2) for h in (1, 3, 5, 7)]
  np.testing.assert_allclose(alibi_slopes(12), expected12, rtol=1e-6)


@pytest.mark.parametrize("overrides,patterns", [
    (dict(position="xpos"), ["model.position='xpos'", *POSITIONS]),
    (dict(position="rope", d_model=12, num_heads=4), ["model.position='rope'", "even", "3"]),
    (dict(relative_buckets=8), ["model.relative_buckets=8", "read by position='t5_bias' only",
                                "model.position='learned'"]),
    (dict(position="t5_bias", relative_buckets=2), ["model.relative_buckets=2", ">= 4"]),
    (dict(position_offset=2, position="rope"), ["model.position_offset=2", "'learned'"]),
    (dict(sinusoid_layout="halves"), ["model.sinusoid_layout='halves'", "'sinusoidal'"]),
    (dict(position_init_std=0.0), ["model.position_init_std=0.0", "positive"]),
])
def test_position_section_rejects_bad_values_naming_the_flat_key(overrides, patterns):
  assert_owner_rejects("positions", overrides, patterns)


@pytest.fixture
def fake_kinds():
  """Two kinds registered for one test: an absolute table of 7 parameters per embedder plus 3 per
  layer stack, and a rotary kind."""
  added = [positions.register_position_kind(positions.PositionKind(
               "fake_absolute", absolute=True, embedding_params=lambda cfg: 7,
               stack_params=lambda cfg: 3)),
           positions.register_position_kind(positions.PositionKind(
               "fake_rotary", rotary=True))]
  yield added
  for kind in added:
    del positions.POSITION_KINDS[kind.name]


def test_the_position_registry_is_the_one_list_every_consumer_reads(fake_kinds):
  """A kind registered here is valid config, and decoding past max_len, parameter counts, length
  evaluation and the HF registry's switch check see it without naming it anywhere."""
  from tfjax.hf import registry  # pylint: disable=import-outside-toplevel
  from tfjax.research import length_eval  # pylint: disable=import-outside-toplevel
  from tfjax.inference import decode_window  # pylint: disable=import-outside-toplevel
  from tfjax.training.accounting import params  # pylint: disable=import-outside-toplevel
  absolute, rotary = (tiny_config(position=k.name) for k in fake_kinds)
  assert positions.has_learned_table(absolute) is False
  assert decode_window.mode(absolute, 16, 1) == "slide"
  assert decode_window.mode(rotary, 16, 1) == "window"
  assert params.analytic_count(absolute) == params.analytic_count(tiny_config(position="none")) + 10
  assert length_eval.extends_rope(rotary) and not length_eval.extends_rope(absolute)
  assert length_eval.has_positions_at(absolute, 64)
  assert not length_eval.has_positions_at(tiny_config(), 64)  # learned: max_len 16
  arch = dataclasses.replace(registry.ARCHITECTURES["llama"], needs=("position:fake_rotary",))
  assert registry.missing_switches(arch) == []
  with pytest.raises(ValueError, match="fake_absolute"):
    tiny_config(position="xpos")  # the choices listed are the registry's


def test_a_kind_acts_through_its_hooks_only():
  """Kinds registered here reuse built-in math through each hook; the model applies them without
  naming them: an embedding hook adding the sinusoid table is position='sinusoidal', a logits
  hook giving ALiBi slopes is 'alibi', and a rotate hook doubling q is 'none' with twice the
  score scale."""
  from conftest import random_params  # pylint: disable=import-outside-toplevel
  from tfjax.nn.masks import LogitsBias  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  hooks = {
      "sinusoidal": dict(embedding=positions.SinusoidalPositions),
      "alibi": dict(logits_bias=lambda cfg, table, visibility, q_len, kv_len: LogitsBias(
          alibi_slopes_H=alibi_slopes(cfg.attention.num_heads))),
      "none": dict(rotate=lambda cfg, q, k, pos, local: (q * 2.0, k)),
  }
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 31, (2, 7)), jnp.int32)
  try:
    for builtin, hook in hooks.items():
      positions.register_position_kind(positions.PositionKind(f"fake_{builtin}", **hook))
      cfg = tiny_config(position=f"fake_{builtin}")
      scale = dict(attention_scale=2.0 * cfg.dim_per_head ** -0.5) if builtin == "none" else {}
      reference = build_model(tiny_config(position=builtin, **scale))
      params = {"params": random_params(reference, ids)}
      got = build_model(cfg).apply(params, ids)
      np.testing.assert_allclose(got, reference.apply(params, ids), rtol=1e-5, atol=1e-5)
      plain = build_model(tiny_config(position="none")).apply(params, ids)
      assert not np.allclose(got, plain, atol=1e-3), builtin  # the hook changed something
  finally:
    for builtin in hooks:
      positions.POSITION_KINDS.pop(f"fake_{builtin}", None)
