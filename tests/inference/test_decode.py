"""KV-cache decoding and generation against full forward passes and exhaustive search."""

import functools
import importlib.util
import itertools
import json
import pathlib

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import pytest

from tfjax.inference import cached_model, decode, sample_loop
from tfjax.nn.config import POSITIONS, ModelConfig
from tfjax.nn.models import build_model

VOCAB = 13


pytestmark = pytest.mark.usefixtures("fast_compiles")  # conftest.py: tiny shapes


def tiny_config(**overrides) -> ModelConfig:
  # Large init_std and an untied head give peaked, varied logits, so greedy paths are not one
  # repeated token and argmax ties do not occur.
  values = dict(family="decoder", vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=4,
                d_ff=32, position="rope", max_len=32, init_std=0.5, tie_embeddings=False)
  values.update(overrides)
  return ModelConfig.from_flat(values).validated()


@functools.lru_cache(maxsize=None)
def init_params(cfg: ModelConfig):
  """Random parameters drawn in NumPy (no XLA compile): N(0, init_std), norm scales near 1."""
  model = build_model(cfg)
  dummy = jnp.zeros((1, 4), jnp.int32)
  args = (dummy, dummy) if cfg.family == "encoder_decoder" else (dummy,)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)["params"])
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    noise = rng.normal(size=leaf.shape).astype(np.float32)
    return 1.0 + 0.1 * noise if path[-1].key == "scale" else cfg.init_std * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.partial(jax.jit, static_argnums=0)
def full_logits(cfg, params, tokens_BxL, encoder_BxS=None):
  """Reference: the ordinary (no cache) forward pass."""
  model = build_model(cfg)
  if cfg.family == "encoder_decoder":
    return model.apply({"params": params}, encoder_BxS, tokens_BxL)
  return model.apply({"params": params}, tokens_BxL)


def reference_log_probs(cfg, sequence, width=8):
  """Full-forward next-token log-probs [len(sequence), V] for one sequence. It sits in a fixed
  [1, width] buffer (causality ignores the tail) so that every call shares one compile."""
  buffer = np.zeros((1, width), np.int32)
  buffer[0, :len(sequence)] = sequence
  logits = full_logits(cfg, init_params(cfg), buffer)[0, :len(sequence)]
  return np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)


def random_tokens(shape, seed):
  return np.random.default_rng(seed).integers(1, VOCAB, shape).astype(np.int32)


# ---- cache == full forward ----------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=(0, 2))
def cached_and_full_logits(cfg, params, prompt_lengths, sequences_BxL, encoder_BxS):
  """Row b: prefill its first prompt_lengths[b] tokens (left-padded to the longest), then feed
  the rest one token per step. Returns (prefill logits [B, P, V], step logits [T, B, V],
  full-forward logits [B, L, V]); one program, so one compile per config."""
  full_BxLxV = full_logits(cfg, params, sequences_BxL, encoder_BxS)
  batch, total = sequences_BxL.shape
  padded_len = max(prompt_lengths)
  lengths_B = jnp.asarray(prompt_lengths, jnp.int32)
  positions_BxP, segment_ids_BxP = cached_model.left_padded_positions(lengths_B, padded_len)
  prompts_BxP = jnp.where(segment_ids_BxP == 1,
                          jnp.take_along_axis(sequences_BxL, positions_BxP, axis=1), 0)
  encoded = None if encoder_BxS is None else cached_model.encode(cfg, params, encoder_BxS)
  cache = cached_model.init_cache(cfg, batch, total,
                            encoder_len=None if encoder_BxS is None else encoder_BxS.shape[1])
  prefill_BxPxV, cache = cached_model.forward_cached(cfg, params, cache, prompts_BxP, positions_BxP,
                                               segment_ids_BxP, encoded)

  def step(cache, t):
    position_B = lengths_B + t
    token_B = jnp.take_along_axis(sequences_BxL, position_B[:, None], axis=1)[:, 0]
    logits_Bx1xV, cache = cached_model.forward_cached(cfg, params, cache, token_B[:, None],
                                                position_B[:, None])
    return cache, logits_Bx1xV[:, 0]

  _, steps_NxBxV = jax.lax.scan(step, cache, jnp.arange(total - padded_len))
  return prefill_BxPxV, steps_NxBxV, full_BxLxV


# One layer unless the test is about stacking (compile time is what these tests spend).
CACHE_CONFIGS = (
    [dict(family="decoder", position=p) for p in POSITIONS]
    + [dict(family="encoder_decoder", position=p, num_kv_heads=2) for p in POSITIONS]  # + GQA
    + [dict(num_layers=2, num_kv_heads=1, window=3, position="rope"),  # MQA, ring of 3 slots
       dict(num_layers=2, window=3, position="alibi", scan_layers=True),
       dict(family="encoder_decoder", num_layers=2, window=3, position="learned"),
       # Gemma 2: sliding and global layers alternate (ring buffer and full caches side by side),
       # soft-capped scores and logits, sandwich norms (and Gemma 3's QK-norm).
       dict(num_layers=2, window=3, window_pattern=2, attention_softcap=1.0, logits_softcap=3.0,
            norm_placement="sandwich", norm="rmsnorm", norm_unit_offset=True, ffn="geglu_tanh",
            attention_scale=0.3, position="rope", qk_norm="rmsnorm"),
       # BART: one token table, per-side offset position tables and norms, final logits bias.
       dict(family="encoder_decoder", position="learned", share_positions=False,
            position_offset=2, embed_norm=True, final_logits_bias=True)])


@pytest.mark.parametrize("overrides", CACHE_CONFIGS,
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_cached_logits_match_full_forward(overrides):
  """Rows with prompts of 4, 2 and 1 tokens share a left-padded prefill, then 7 single-token
  steps: every position of every row equals that row's own full forward pass. The 1-token row
  is pure step-by-step decoding; with window=3 the 11 tokens wrap the ring buffer repeatedly."""
  cfg = tiny_config(**overrides)
  params = init_params(cfg)
  prompt_lengths, steps = (4, 2, 1), 7
  total = max(prompt_lengths) + steps
  sequences_BxL = random_tokens((3, total), seed=1)
  encoder_BxS = random_tokens((3, 5), seed=2) if cfg.family == "encoder_decoder" else None
  # Shorter rows use a prefix of their sequence; causality makes the rest irrelevant.
  prefill_BxPxV, steps_NxBxV, expected_BxLxV = cached_and_full_logits(
      cfg, params, prompt_lengths, sequences_BxL, encoder_BxS)
  padded_len = max(prompt_lengths)
  for b, n in enumerate(prompt_lengths):
    np.testing.assert_allclose(prefill_BxPxV[b, padded_len - n:], expected_BxLxV[b, :n],
                               atol=1e-5, err_msg=f"prefill of row {b}")
    np.testing.assert_allclose(steps_NxBxV[:, b], expected_BxLxV[b, n:n + steps], atol=1e-5,
                               err_msg=f"steps of row {b}")


@pytest.mark.parametrize("scan_layers", [False, True])
def test_take_cache_rows_picks_rows_of_every_layer(scan_layers):
  cfg = tiny_config(scan_layers=scan_layers, num_layers=2)
  cache = cached_model.init_cache(cfg, batch=3, max_len=4)
  axis = 1 if scan_layers else 0  # nn.scan puts the layer axis first
  marked = jax.tree.map(
      lambda x: x if x.ndim <= axis else jnp.zeros_like(x) + jnp.arange(3, dtype=x.dtype).reshape(
          (1,) * axis + (3,) + (1,) * (x.ndim - axis - 1)), cache)
  picked = cached_model.take_cache_rows(cfg, marked, jnp.asarray([2, 0, 0, 1]))
  for before, after in zip(jax.tree.leaves(marked), jax.tree.leaves(picked)):
    if before.ndim <= axis:  # the shared write counter
      np.testing.assert_array_equal(after, before)
    else:
      rows = np.moveaxis(np.asarray(after), axis, 0).reshape(4, -1)
      np.testing.assert_array_equal(rows, np.asarray([2, 0, 0, 1])[:, None] * np.ones_like(rows))


def test_cache_is_a_ring_buffer_with_a_window():
  cache = cached_model.init_cache(tiny_config(window=3, num_kv_heads=2), batch=2, max_len=100)
  assert cache["decoder"]["layers_0"]["self_attention"]["cached_key"].shape == (2, 3, 2, 4)


# ---- generate: greedy, batching, length checks ------------------------------------------------
# Most tests share one config, these prompts and max_new_tokens, so they share compiled programs.
PROMPTS = [[4, 8, 2], [6]]
NEW = 5


def greedy(cfg, prompts=PROMPTS, max_new_tokens=NEW, **kwargs):
  return decode.generate(cfg, init_params(cfg), prompts, max_new_tokens=max_new_tokens, **kwargs)


def sample(cfg, prompts=PROMPTS, max_new_tokens=NEW, **kwargs):
  return decode.generate(cfg, init_params(cfg), prompts, max_new_tokens=max_new_tokens,
                         strategy="sample", **kwargs)


@pytest.mark.parametrize("fast_compile", [False, True])
def test_greedy_matches_argmax_of_full_forward(fast_compile):
  cfg = tiny_config()
  out = greedy(cfg, fast_compile=fast_compile)
  assert out.tokens.shape == (2, NEW) and out.lengths.tolist() == [NEW, NEW]
  for b, prompt in enumerate(PROMPTS):
    sequence, score = list(prompt), 0.0
    for _ in range(NEW):
      log_probs = reference_log_probs(cfg, sequence)[-1]
      sequence.append(int(np.argmax(log_probs)))
      score += log_probs[sequence[-1]]
    assert np.asarray(out.tokens[b]).tolist() == sequence[len(prompt):]
    assert float(out.scores[b]) == pytest.approx(score, abs=1e-4)


def test_the_decode_config_picks_the_attention_implementation_outside_the_block():
  """Cached attention masks by absolute slot positions, which only the XLA reference takes: the
  decode config (not MultiHeadAttention) sets it; a full forward pass keeps the run's own."""
  chunked = tiny_config(attention_impl="chunked", dropout=0.1, remat="full")
  decode_cfg = cached_model.decode_config(chunked)
  assert decode_cfg.decode and decode_cfg.attention_impl == "xla"
  assert decode_cfg.deterministic and decode_cfg.remat == "none"
  full_pass = cached_model.inference_config(chunked)
  assert full_pass.attention_impl == "chunked" and not full_pass.decode


@pytest.mark.parametrize("family,position,window", [
    ("decoder", "rope", 3), ("encoder_decoder", "learned", None)])
def test_batched_prompts_of_different_lengths_match_each_alone(family, position, window):
  cfg = tiny_config(family=family, position=position, window=window)
  prompts = [[4, 8, 2, 9, 1], [6, 3]]
  encoder = [[5, 2, 7, 7], [9, 1]] if family == "encoder_decoder" else None
  batched = greedy(cfg, prompts, max_new_tokens=6, encoder_inputs=encoder)
  for b, prompt in enumerate(prompts):
    alone = greedy(cfg, [prompt], max_new_tokens=6,
                   encoder_inputs=None if encoder is None else [encoder[b]])
    np.testing.assert_array_equal(batched.tokens[b], alone.tokens[0])
    np.testing.assert_allclose(batched.scores[b], alone.scores[0], atol=1e-5)


def test_padded_array_with_lengths_equals_list_of_prompts():
  cfg = tiny_config()
  as_array = greedy(cfg, np.asarray([[4, 8, 2], [6, 0, 0]]), prompt_lengths=[3, 1])
  np.testing.assert_array_equal(greedy(cfg).tokens, as_array.tokens)


@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="topk"), "strategy"), (dict(strategy="sample", temperature=0.0), "temperature"),
    (dict(strategy="sample", top_p=1.5), "top_p"), (dict(strategy="greedy", num_samples=2), "num"),
    (dict(strategy="beam", beam_size=2, num_samples=3), "beam_size"), (dict(eos_id=VOCAB), "eos")])
def test_invalid_settings_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    greedy(tiny_config(), **kwargs)


def test_encoder_decoder_needs_encoder_inputs():
  with pytest.raises(ValueError, match="encoder_inputs"):
    greedy(tiny_config(family="encoder_decoder"))
  with pytest.raises(ValueError, match="encoder_inputs"):
    greedy(tiny_config(), encoder_inputs=[[1], [2]])


# ---- EOS ---------------------------------------------------------------------------------------
def test_eos_stops_rows_independently():
  cfg = tiny_config()
  free = np.asarray(greedy(cfg).tokens)
  eos = int(free[0, 1])  # row 0 must stop after its second token
  out = greedy(cfg, eos_id=eos, pad_id=0)
  lengths = []
  for b in range(len(PROMPTS)):
    hits = np.flatnonzero(free[b] == eos)
    n = int(hits[0]) + 1 if hits.size else NEW
    expected = np.concatenate([free[b, :n], np.zeros(NEW - n, np.int32)])
    np.testing.assert_array_equal(out.tokens[b], expected)
    assert int(out.lengths[b]) == n
    lengths.append(n)
  assert lengths[0] <= 2 and len(set(lengths)) > 1, lengths  # rows really stopped differently


# ---- sampling ----------------------------------------------------------------------------------
def test_top_k_one_and_tiny_temperature_equal_greedy():
  cfg = tiny_config()
  expected = greedy(cfg).tokens
  np.testing.assert_array_equal(sample(cfg, top_k=1, rng=3).tokens, expected)
  np.testing.assert_array_equal(sample(cfg, temperature=1e-4, rng=4).tokens, expected)


def test_seeded_sampling_is_reproducible():
  cfg = tiny_config()
  first = sample(cfg, num_samples=3, rng=7, top_p=0.9)
  again = sample(cfg, num_samples=3, rng=jax.random.PRNGKey(7), top_p=0.9)
  other = sample(cfg, num_samples=3, rng=8, top_p=0.9)
  np.testing.assert_array_equal(first.tokens, again.tokens)
  assert not np.array_equal(first.tokens, other.tokens)
  assert first.tokens.shape == (2 * 3, NEW)  # row b * 3 + s: sample s of prompt b


def numpy_allowed(logits, temperature=1.0, top_k=None, top_p=None):
  """Set of token ids that temperature/top-k/top-p sampling may return, in float64."""
  logits = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-logits)
  if top_k is not None:
    order = order[:top_k]
  probs = np.exp(logits[order] - logits[order].max())
  probs /= probs.sum()
  if top_p is not None:
    # Smallest prefix of the ranked tokens whose probability mass reaches top_p.
    order = order[:int(np.searchsorted(np.cumsum(probs), top_p) + 1)]
  return set(order.tolist())


@pytest.mark.parametrize("top_k,top_p", [(None, 0.5), (None, 0.9), (4, 0.8)])
def test_filter_logits_keeps_exactly_the_numpy_nucleus(top_k, top_p):
  logits = np.random.default_rng(0).normal(size=(200, 17)).astype(np.float32) * 2
  filtered = np.asarray(sample_loop.filter_logits(jnp.asarray(logits), temperature=0.7, top_k=top_k,
                                             top_p=top_p))
  for row, kept in zip(logits, np.isfinite(filtered)):
    assert set(np.flatnonzero(kept).tolist()) == numpy_allowed(row, 0.7, top_k, top_p)


@pytest.mark.parametrize("top_k,top_p", [(None, 0.6), (3, 0.9)])
def test_top_p_samples_never_leave_the_nucleus(top_k, top_p):
  """500 seeded draws of the first new token per prompt, against the nucleus that NumPy computes
  from the full-forward logits."""
  cfg = tiny_config()
  draws = sample(cfg, max_new_tokens=1, num_samples=500, rng=11, top_k=top_k,
                 top_p=top_p).tokens[:, 0].reshape(len(PROMPTS), 500)
  for b, prompt in enumerate(PROMPTS):
    nucleus = numpy_allowed(reference_log_probs(cfg, prompt)[-1], top_k=top_k, top_p=top_p)
    seen = set(np.asarray(draws[b]).tolist())
    assert seen <= nucleus, (seen, nucleus)
    assert len(nucleus) == 1 or len(seen) > 1  # it really samples


# ---- beam search -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_beam_size_one_equals_greedy(family):
  cfg = tiny_config(family=family)
  encoder = [[5, 2, 7], [9, 1, 3, 3]] if family == "encoder_decoder" else None
  free = greedy(cfg, encoder_inputs=encoder).tokens
  eos = int(free[0, 1])  # makes at least row 0 end early
  expected = greedy(cfg, eos_id=eos, encoder_inputs=encoder)
  beam = decode.generate(cfg, init_params(cfg), PROMPTS, max_new_tokens=NEW, strategy="beam",
                         beam_size=1, length_penalty=0.0, eos_id=eos, encoder_inputs=encoder)
  assert int(expected.lengths[0]) <= 2
  np.testing.assert_array_equal(beam.tokens, expected.tokens)
  np.testing.assert_array_equal(beam.lengths, expected.lengths)
  np.testing.assert_allclose(beam.scores, expected.scores, atol=1e-5)


def continuation_log_probs(cfg, params, prompt, max_new, width, encoder=None):
  """log p(next token) [width, V] after prompt + c, for every continuation c of max_new tokens:
  one full forward pass over all V^max_new of them (a shorter c reads any row it prefixes)."""
  continuations = list(itertools.product(range(cfg.vocab_size), repeat=max_new))
  # One width for every prompt (one compile); causality makes the right padding unseen.
  batch = np.zeros((len(continuations), width), np.int32)
  for i, c in enumerate(continuations):
    batch[i, :len(prompt) + max_new] = list(prompt) + list(c)
  enc = None if encoder is None else np.repeat(np.asarray([encoder], np.int32), len(batch), 0)
  log_probs = np.asarray(jax.nn.log_softmax(full_logits(cfg, params, batch, enc), -1), np.float64)
  return dict(zip(continuations, log_probs))


def exhaustive_ranking(table, prompt_len, max_new, eos, alpha):
  """Every finished continuation (ends in EOS, or reaches max_new without one) with its GNMT
  score, best first."""
  others = [v for v in range(len(next(iter(table.values()))[0])) if v != eos]
  candidates = [body + (eos,) for n in range(max_new) for body in itertools.product(others,
                                                                                     repeat=n)]
  candidates += list(itertools.product(others, repeat=max_new))
  scored = []
  for c in candidates:
    log_probs = table[c + (0,) * (max_new - len(c))]
    total = sum(log_probs[prompt_len - 1 + t, token] for t, token in enumerate(c))
    scored.append((total / ((5.0 + len(c)) / 6.0) ** alpha, c))
  return sorted(scored, reverse=True)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_beam_search_finds_the_exhaustive_best(family):
  """vocab 5, 3 new tokens: with 80 = V (V-1)^(N-1) beams every candidate of every step ranks in
  the top K, so beam search is exhaustive and its best hypotheses must be brute force's."""
  cfg = tiny_config(family=family, vocab_size=5, init_std=0.3)
  params = init_params(cfg)
  prompts = [[1, 3, 2], [4]]
  encoder = [[2, 4, 1], [3, 3, 1]] if family == "encoder_decoder" else None  # equal: one compile
  alpha, max_new = 0.6, 3
  tables = [continuation_log_probs(cfg, params, prompt, max_new, width=6,
                                   encoder=None if encoder is None else encoder[b])
            for b, prompt in enumerate(prompts)]
  # EOS = row 0's most likely first token, so ending early competes with going on.
  eos = int(np.argmax(tables[0][(0,) * max_new][len(prompts[0]) - 1]))
  out = decode.generate(cfg, params, prompts, max_new_tokens=max_new, strategy="beam",
                        beam_size=80, num_samples=4, length_penalty=alpha, eos_id=eos,
                        pad_id=0, encoder_inputs=encoder)
  tokens_BxMxN = np.asarray(out.tokens).reshape(len(prompts), 4, max_new)
  lengths_BxM = np.asarray(out.lengths).reshape(len(prompts), 4)
  scores_BxM = np.asarray(out.scores).reshape(len(prompts), 4)
  returned = []
  for b, prompt in enumerate(prompts):
    ranking = exhaustive_ranking(tables[b], len(prompt), max_new, eos, alpha)
    returned += [c for _, c in ranking[:4]]
    for rank in range(4):
      score, best = ranking[rank]
      length = lengths_BxM[b, rank]
      assert tuple(tokens_BxMxN[b, rank, :length].tolist()) == best, rank
      assert np.all(tokens_BxMxN[b, rank, length:] == 0)
      assert scores_BxM[b, rank] == pytest.approx(score, abs=1e-4)
  assert any(c[-1] == eos and len(c) < max_new for c in returned)  # EOS really matters


# ---- scripts -----------------------------------------------------------------------------------
def load_script(name):
  path = pathlib.Path(__file__).resolve().parents[2] / "experiments" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_generate_script_restores_a_trained_run(tmp_path, capsys):
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
  config = base_config()  # a 2-step run of the synthetic copy task: only restoring is tested
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(4, 8),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, position="rope", max_len=64)
  config.train.update(num_steps=2, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=100, checkpoint_every=2, eval_at_start=False)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  script = load_script("generate")
  beams = script.main([f"--workdir={workdir}", "--prompt=^abc|", "--strategy=beam",
                       "--beam_size=3", "--num_samples=2", "--max_new_tokens=6"])
  assert len(beams) == 2 and beams[0]["score"] >= beams[1]["score"]
  assert all(r["step"] == 2 and r["text"].startswith("^abc|") for r in beams)
  assert all(len(r["ids"]) <= 6 and (len(r["ids"]) == 6 or r["ids"][-1] == 3) for r in beams)
  assert "checkpoint step 2" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    script.main([f"--workdir={workdir}", "--prompt=^xyz|"])  # not in the copy task's alphabet


def test_bench_decode_smoke(tmp_path):
  bench = load_script("bench_decode")
  bench.main(["--smoke", f"--out={tmp_path}"])
  result = json.loads((tmp_path / "bench_decode.json").read_text())
  assert result["rows"] and all(r["cached_tokens_per_s"] > 0 for r in result["rows"])
  assert "tokens/s" in (tmp_path / "bench_decode.md").read_text()
