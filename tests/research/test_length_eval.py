"""Perplexity against evaluation length (tfjax/research/length_eval.py): every target scored once with the
promised context, perplexities equal to scoring the windows directly with the model, learned
positions past their table reported as n/a, and the CLI's outputs."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.training.loop import experiment, train
from tfjax.research import length_eval, sweep
from tfjax.training.config.defaults import base_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scoring_windows_score_every_target_once_with_enough_context():
  for num_targets, length, stride in ((64, 16, 16), (64, 16, 4), (70, 32, 8), (50, 16, 5)):
    starts, first = length_eval.scoring_windows(num_targets, length, stride)
    scored = [s + 1 + o for s, f in zip(starts, first) for o in range(f, length)]
    assert sorted(scored) == list(range(1, num_targets + 1))  # targets 1..N, each once
    for w, (s, f) in enumerate(zip(starts, first)):
      assert s + length <= num_targets
      if w > 0:  # after the first window every scored target sees >= length - stride tokens
        assert f >= length - stride


def test_window_batches_weight_exactly_the_scored_targets():
  tokens = np.arange(100) * 3  # token value = 3 x its position: shifts are easy to read
  starts, first = length_eval.scoring_windows(40, 16, 8)
  batches = list(length_eval.window_batches(tokens, starts, first, 16, rows=2))
  assert [b["inputs"].shape for b in batches] == [(2, 16)] * 2  # 4 windows, 2 per batch
  for b in batches:
    np.testing.assert_array_equal(b["targets"], b["inputs"] + 3)  # the next token
  weights = np.concatenate([b["weights"] for b in batches])
  assert weights.sum() == 40 and weights[0].sum() == 16 and weights[1:].sum(1).tolist() == [8] * 3


def test_bad_arguments_name_the_problem():
  with pytest.raises(ValueError, match="fewer than one window"):
    length_eval.scoring_windows(10, 16, 4)
  with pytest.raises(ValueError, match="multiples must be >= 1"):
    length_eval.perplexity_vs_length("unused", multiples=(1, 0), run=(None, None, None))
  with pytest.raises(ValueError, match="stride_fraction"):
    length_eval.perplexity_vs_length("unused", stride_fraction=0.0, run=(None, None, None))


def _text_lm_config(root, position, steps=6, layers=2):
  """A tiny char LM config on a small text file (table of 2 x seq_len)."""
  rng = np.random.default_rng(0)
  words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis"]
  text = "\n".join(" ".join(rng.choice(words, 8)) for _ in range(200))
  (root / "corpus.txt").write_text(text)
  config = base_config()
  config.data.update(name="text", path=str(root / "corpus.txt"), tokenizer="char", seq_len=16)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=layers,
                      num_heads=2, d_ff=32, position=position, max_len=32)
  config.optimizer.update(lr=3e-3, warmup_steps=1)
  config.train.update(num_steps=steps, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=steps, log_every=3, checkpoint_every=steps)
  return config


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  """A tiny char LM trained for a few steps (learned positions, a table of 2 x seq_len)."""
  root = tmp_path_factory.mktemp("text_run")
  workdir = str(root / "run")
  train.train_and_evaluate(_text_lm_config(root, "learned"), workdir)
  return workdir


def _direct_nonoverlap_ppl(model_cfg, params, tokens, num_targets, length):
  """Perplexity of consecutive windows of `length` scored directly with the model."""
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.training.optim import losses  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  apply = jax.jit(build_model(model_cfg).apply)
  total = 0.0
  for start in range(0, num_targets, length):
    chunk = tokens[start:start + length + 1]
    logits = apply({"params": params}, chunk[None, :-1])
    loss_sum, _ = losses.cross_entropy(logits, chunk[None, 1:], np.ones((1, length), np.float32))
    total += float(jax.device_get(loss_sum))
  return math.exp(total / num_targets)


def test_rope_extensions_rescale_by_the_length_ratio_and_are_the_identity_at_l(tmp_path):
  from conftest import random_params  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  from tfjax.nn.positions import scaled_rope_frequencies  # pylint: disable=import-outside-toplevel
  config = _text_lm_config(tmp_path, "rope", layers=1)
  exp = experiment.prepare(config)
  cfg = exp.model_config  # untrained: random weights (N(0, 0.3^2)) are far from uniform
  params = random_params(build_model(cfg), np.zeros((1, 16), np.int32))
  out = length_eval.perplexity_vs_length(str(tmp_path), multiples=(1, 2), max_tokens=64,
                                         run=(config, exp, params), rope_scalings=("linear",))
  assert len(out) == 1 + 2 * 2 * 2  # tokens; 2 modes x 2 lengths x (unscaled + linear)
  assert out["long/ppl_nonoverlap_linear@16"] == pytest.approx(out["long/ppl_nonoverlap@16"])
  assert out["long/ppl_sliding_linear@32"] != pytest.approx(out["long/ppl_sliding@32"])
  # At T = L every extension is the identity: the same frequencies and no gain.
  positions = np.arange(16)[None]
  plain, _ = scaled_rope_frequencies(cfg, positions)
  for kind in length_eval.ROPE_EXTENSIONS:
    freqs, gain = scaled_rope_frequencies(
        length_eval.rope_extension_config(cfg, kind, 16, 16), positions)
    np.testing.assert_allclose(np.asarray(freqs), np.asarray(plain), rtol=1e-6, err_msg=kind)
    assert gain == 1.0
  tokens = np.asarray(exp.dataset.val_tokens)[:65]
  # Position interpolation at T = 2L: factor 2, scored directly.
  assert out["long/ppl_nonoverlap_linear@32"] == pytest.approx(_direct_nonoverlap_ppl(
      cfg.replace(rope_scaling="linear", rope_scaling_factor=2.0), params, tokens, 64, 32),
      rel=1e-4)
  yarn = length_eval.rope_extension_config(cfg, "yarn", 64, 16)
  yarn = yarn.positions.rope
  assert (yarn.scaling_factor, yarn.original_max_len) == (4.0, 16)
  dynamic = length_eval.rope_extension_config(cfg, "dynamic", 64, 16)
  dynamic = dynamic.positions.rope
  assert (dynamic.scaling_factor, dynamic.original_max_len) == (1.0, 16)
  with pytest.raises(ValueError, match="rescales an unscaled RoPE model"):
    length_eval.rope_extension_config(cfg.replace(position="alibi"), "linear", 32, 16)


def test_matches_direct_scoring_and_marks_learned_overflow_na(text_run):
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.training.optim import losses  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  run = sweep.restore_run(text_run)
  _, exp, params = run
  out = length_eval.perplexity_vs_length(text_run, multiples=(1, 2, 4), max_tokens=None, run=run)
  assert out["long/tokens"] > 0 and out["long/tokens"] % 64 == 0
  assert out["long/ppl_nonoverlap@64"] is None and out["long/ppl_sliding@64"] is None  # > 32
  for key in ("long/ppl_nonoverlap@16", "long/ppl_sliding@16", "long/ppl_nonoverlap@32",
              "long/ppl_sliding@32"):
    assert 1.0 < out[key] < 100.0, (key, out[key])
  # Nonoverlapping windows of 32 scored directly: chunks of the validation split, summed NLL.
  tokens = np.asarray(exp.dataset.val_tokens)[:out["long/tokens"] + 1]
  apply = jax.jit(build_model(exp.model_config).apply)
  total = 0.0
  for start in range(0, out["long/tokens"], 32):
    chunk = tokens[start:start + 33]
    logits = apply({"params": params}, chunk[None, :-1])
    loss_sum, _ = losses.cross_entropy(logits, chunk[None, 1:], np.ones((1, 32), np.float32))
    total += float(jax.device_get(loss_sum))
  assert out["long/ppl_nonoverlap@32"] == pytest.approx(math.exp(total / out["long/tokens"]),
                                                        rel=1e-4)
  # Without `run`, the newest checkpoint in the workdir is restored: the same numbers.
  assert length_eval.perplexity_vs_length(text_run, multiples=(1, 2, 4), max_tokens=None) == (
      pytest.approx(out))


def test_cli_writes_length_eval_json_and_prints_the_table(text_run):
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "experiments", "eval_length.py"),
       f"--workdir={text_run}", "--multiples=1,4", "--max_tokens=128"],
      capture_output=True, text=True, timeout=300, cwd=REPO,
      env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
          REPO, os.environ.get("PYTHONPATH")]))})  # this checkout's tfjax, not an installed one
  assert result.returncode == 0, result.stdout + result.stderr
  with open(os.path.join(text_run, length_eval.RESULT_FILE)) as f:
    written = json.load(f)
  assert written["long/tokens"] == 128 and written["long/ppl_sliding@64"] is None
  assert written == pytest.approx(length_eval.perplexity_vs_length(
      text_run, multiples=(1, 4), max_tokens=128))
  assert "perplexity on 128 validation tokens" in result.stdout
  assert length_eval.format_table(written) in result.stdout


def test_rejects_a_run_that_is_not_a_text_lm(tmp_path):
  config = base_config()  # the synthetic copy task: no validation text to slide over
  config.task = "lm"
  config.data.update(name="copy", form="decoder", train_lengths=(1, 4), test_lengths=(4,),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, max_len=32)
  exp = experiment.prepare(config)
  with pytest.raises(ValueError, match="needs a text language-model run"):
    length_eval.perplexity_vs_length(str(tmp_path), run=(config, exp, None))


def test_context_lengths_between_l_and_2l_are_whole_tokens():
  assert length_eval.context_lengths((1, 1.25, 1.5, 1.75, 2), 64) == [64, 80, 96, 112, 128]
  with pytest.raises(ValueError, match="not a whole number of tokens"):
    length_eval.context_lengths((1.1,), 64)
