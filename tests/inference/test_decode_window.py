"""Generation past model.max_len (tfjax/inference/decode_window.py) against full forward passes.

Reference: the model's ordinary forward pass (no cache) over the last max_len tokens of the
sequence at positions 0..max_len-1, for one sequence at a time (nanoGPT's cropped-context
sampling). Relative encodings decode with a ring-buffer window of max_len keys: with one layer
that is the cropped context exactly; with more it is the sliding-window model's forward pass.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model
from tfjax.inference import decode, decode_window

VOCAB, MAX_LEN, NEW = 11, 8, 12
PROMPTS = [[3, 7, 1, 9, 4], [5, 2, 8, 6, 1, 3, 10, 2, 7, 4]]  # the second is longer than max_len
ENCODER = [[4, 5, 6], [7, 8]]


pytestmark = pytest.mark.usefixtures("fast_compiles")  # conftest.py: tiny shapes


def config(**overrides) -> ModelConfig:
  values = dict(family="decoder", vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2,
                d_ff=32, position="learned", max_len=MAX_LEN, init_std=0.5,
                tie_embeddings=False, deterministic=True)
  values.update(overrides)
  return ModelConfig.from_flat(values).validated()


@functools.lru_cache(maxsize=None)
def params_of(cfg: ModelConfig):
  """N(0, init_std) parameters drawn in NumPy (norm scales near 1); no XLA compile."""
  dummy = jnp.zeros((1, 4), jnp.int32)
  args = (dummy, dummy) if cfg.family == "encoder_decoder" else (dummy,)
  shapes = nn.meta.unbox(jax.eval_shape(build_model(cfg).init, jax.random.PRNGKey(0), *args)[
      "params"])
  rng = np.random.default_rng(1)

  def draw(path, leaf):
    noise = rng.normal(size=leaf.shape).astype(np.float32)
    return 1.0 + 0.1 * noise if path[-1].key == "scale" else cfg.init_std * noise
  return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg, params, tokens_1xL, encoder_1xS):
  model = build_model(cfg)
  if cfg.family == "encoder_decoder":
    return model.apply({"params": params}, encoder_1xS, tokens_1xL)
  return model.apply({"params": params}, tokens_1xL)


def next_log_probs(cfg, params, sequence, encoder=None, *, width):
  """Log-probs of the token after `sequence`, from one forward pass of `sequence` placed at the
  start of a [1, width] buffer (causality ignores the tail; one compile per config)."""
  buffer = np.zeros((1, width), np.int32)
  buffer[0, :len(sequence)] = sequence
  enc = None if encoder is None else np.asarray([encoder], np.int32)
  logits = _forward(cfg, params, buffer, enc)[0, len(sequence) - 1]
  return np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)), np.float64)


def cropped(cfg, params, sequence, encoder=None):
  """Reference next-token log-probs: the last max_len tokens at positions 0..max_len-1."""
  return next_log_probs(cfg, params, sequence[-cfg.max_len:], encoder, width=cfg.max_len)


def windowed(cfg, params, sequence, encoder=None):
  """Reference for relative encodings with several layers: the whole sequence through the model
  with a causal sliding window of max_len keys."""
  return next_log_probs(cfg.replace(window=cfg.max_len), params, sequence, encoder,
                        width=max(len(p) for p in PROMPTS) + NEW)


def greedy_reference(reference, cfg, params, prompt, encoder=None):
  sequence, score = list(prompt), 0.0
  for _ in range(NEW):
    log_probs = reference(cfg, params, sequence, encoder)
    sequence.append(int(np.argmax(log_probs)))
    score += log_probs[sequence[-1]]
  return sequence[len(prompt):], score


def score_of(reference, cfg, params, prompt, new_tokens, encoder=None):
  sequence, score = list(prompt), 0.0
  for token in new_tokens:
    score += reference(cfg, params, sequence, encoder)[token]
    sequence.append(token)
  return score


@pytest.mark.parametrize("cfg,reference", [
    (config(position="learned"), cropped),
    (config(position="sinusoidal"), cropped),
    (config(position="rope"), cropped),
    (config(position="alibi"), cropped),
    (config(position="rope", num_layers=2), windowed),
    (config(position="learned", family="encoder_decoder", num_decoder_layers=1), cropped),
], ids=["learned", "sinusoidal", "rope", "alibi", "rope-2layers-window",
        "encoder_decoder-learned"])
def test_greedy_past_max_len_equals_reference(cfg, reference):
  params = params_of(cfg)
  seq2seq = cfg.family == "encoder_decoder"
  prompts = [[1], [1, 2, 3]] if seq2seq else PROMPTS
  encoder = ENCODER if seq2seq else None
  out = decode.generate(cfg, params, prompts, max_new_tokens=NEW, encoder_inputs=encoder)
  assert out.tokens.shape == (2, NEW) and out.lengths.tolist() == [NEW, NEW]
  for b, prompt in enumerate(prompts):
    tokens, score = greedy_reference(reference, cfg, params, prompt,
                                     None if encoder is None else encoder[b])
    assert np.asarray(out.tokens[b]).tolist() == tokens, b
    assert float(out.scores[b]) == pytest.approx(score, abs=1e-3)


def test_sampled_scores_are_the_cropped_context_log_probs():
  """Each sample's reported log-prob is the reference's, token by token, past max_len."""
  cfg = config(position="learned", num_layers=2)
  params = params_of(cfg)
  out = decode.generate(cfg, params, PROMPTS, max_new_tokens=NEW, strategy="sample",
                        num_samples=2, rng=3)
  assert out.tokens.shape == (4, NEW)
  for row in range(4):
    new = np.asarray(out.tokens[row]).tolist()
    assert float(out.scores[row]) == pytest.approx(
        score_of(cropped, cfg, params, PROMPTS[row // 2], new), abs=1e-3)
  assert np.asarray(out.tokens[0]).tolist() != np.asarray(out.tokens[1]).tolist()


def test_beam_search_past_max_len_scores_each_hypothesis_by_the_reference():
  cfg = config(position="learned")
  params = params_of(cfg)
  out = decode.generate(cfg, params, PROMPTS, max_new_tokens=NEW, strategy="beam", beam_size=3,
                        num_samples=2, length_penalty=0.6)
  penalty = ((5.0 + NEW) / 6.0) ** 0.6
  for row in range(4):
    new = np.asarray(out.tokens[row]).tolist()
    assert float(out.scores[row]) == pytest.approx(
        score_of(cropped, cfg, params, PROMPTS[row // 2], new) / penalty, abs=1e-3)
  # Beam search finds a sequence at least as likely as greedy's (here: with 3 beams).
  greedy = decode.generate(cfg, params, PROMPTS, max_new_tokens=NEW)
  for b in range(2):
    assert float(out.scores[2 * b]) * penalty >= float(greedy.scores[b]) - 1e-4


def test_modes():
  learned, rope = config(position="learned"), config(position="rope")
  assert decode_window.mode(learned, 5, 3) == "fits"
  assert decode_window.mode(learned, 5, 4) == "slide"
  assert decode_window.mode(config(position="sinusoidal"), 8, 1) == "slide"
  assert decode_window.mode(rope, 8, 1) == "window"
  assert decode_window.windowed_config(rope).attention.window == MAX_LEN
  assert decode_window.windowed_config(config(position="rope", window=3)).attention.window == 3


def test_encoder_inputs_longer_than_a_learned_table_still_raise():
  cfg = config(family="encoder_decoder", num_decoder_layers=1)
  with pytest.raises(ValueError, match="encoder inputs of 9 tokens.*max_len=8"):
    decode.generate(cfg, params_of(cfg), [[1]], max_new_tokens=2, encoder_inputs=[[2] * 9])
