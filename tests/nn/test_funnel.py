"""Funnel Transformer blocks (tfjax/nn/funnel.py, funnel_attention.py) against NumPy written
here: the stride-2 mean/max/min pooling with separate_cls / truncate_seq, the stride pooling of
positions and masks, the decoder's up-sampling, the relative shift (the score of distance
p_i - p_j lands under key j), the sequence halving per block, and a short training run."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os

import jax
import numpy as np
import pytest

from run_helpers import read_metrics
from tfjax.nn import funnel_attention as fa
from tfjax.nn.funnel import Funnel, FunnelConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = list(itertools.product([True, False], [True, False]))  # (separate_cls, truncate_seq)


def np_pool(x_BxL, mode, separate_cls, truncate_seq):
  """The paper's pooling: [CLS] kept as is, the other tokens averaged (max, min) in consecutive
  pairs (a last odd one alone); truncate_seq first drops the last token."""
  reduce = {"mean": np.mean, "max": np.max, "min": np.min}[mode]
  if separate_cls:
    body = x_BxL[:, 1:-1] if truncate_seq else x_BxL[:, 1:]
    head = [x_BxL[:, 0]]
  else:
    body, head = x_BxL, []
  pairs = [reduce(body[:, k:k + 2], axis=1) for k in range(0, body.shape[1], 2)]
  return np.stack(head + pairs, axis=1)


@pytest.mark.parametrize("separate_cls,truncate_seq", FLAGS)
@pytest.mark.parametrize("mode", ["mean", "max", "min"])
def test_pool_matches_numpy(mode, separate_cls, truncate_seq):
  rng = np.random.default_rng(0)
  for length in range(3, 10):
    x = rng.normal(size=(2, length, 3)).astype(np.float32)
    want = np_pool(x, mode, separate_cls, truncate_seq)
    got = np.asarray(fa.pool(x, mode, separate_cls, truncate_seq))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str(length))


@pytest.mark.parametrize("separate_cls,truncate_seq", FLAGS)
def test_stride_pool_picks_each_pair_first_token(separate_cls, truncate_seq):
  """Positions / mask rows of pooled tokens: [CLS], then the first token of each pair."""
  for length in range(3, 10):
    x = np.arange(length)
    if separate_cls:
      body = x[1:-1] if truncate_seq else x[1:]
      want = np.concatenate([[0], body[::2]])
    else:
      want = x[::2]
    got = np.asarray(fa.stride_pool(x, 0, separate_cls, truncate_seq))
    np.testing.assert_array_equal(got, want)
    # The pooled length agrees with what pooling the hidden states gives.
    assert len(got) == np_pool(x[None, :, None], "mean", separate_cls, truncate_seq).shape[1]


def np_upsample(x_BxTxD, stride, target_len, separate_cls, truncate_seq):
  """Token j of the output reads pooled token j // stride; under separate_cls [CLS] is token 0
  and token j >= 1 reads pooled token 1 + (j - 1) // stride. Where none exists (truncate_seq
  dropped it), zeros."""
  b, t, d = x_BxTxD.shape
  out = np.zeros((b, target_len, d), x_BxTxD.dtype)
  for j in range(target_len):
    src = j // stride if not separate_cls else (0 if j == 0 else 1 + (j - 1) // stride)
    if src < t:
      out[:, j] = x_BxTxD[:, src]
    else:
      assert separate_cls and truncate_seq, "only truncation drops tokens"
  return out


@pytest.mark.parametrize("separate_cls,truncate_seq", FLAGS)
def test_upsample_matches_numpy_and_undoes_the_pooling(separate_cls, truncate_seq):
  rng = np.random.default_rng(1)
  for length, stride in itertools.product(range(5, 12), (2, 4)):
    blocks = 1 + stride.bit_length() - 1
    cfg = FunnelConfig(block_sizes=(1,) * blocks, separate_cls=separate_cls,
                       truncate_seq=truncate_seq)
    pooled_len = cfg.lengths(length)[-1]
    x = rng.normal(size=(2, pooled_len, 3)).astype(np.float32)
    got = np.asarray(fa.upsample(x, stride, length, separate_cls, truncate_seq))
    np.testing.assert_array_equal(got, np_upsample(x, stride, length, separate_cls,
                                                   truncate_seq))
    # Up-sampling undoes the pooling: pool the positions with min (each group's first token),
    # up-sample, and every token j lands in the group it was pooled into, which starts at
    # up[j] and spans `stride` tokens (except tokens truncation dropped: zeros).
    groups = np.arange(length, dtype=np.float32)[None, :, None]
    for _ in range(blocks - 1):
      groups = np_pool(groups, "min", separate_cls, truncate_seq)
    up = np_upsample(groups, stride, length, separate_cls, truncate_seq)[0, :, 0]
    j = np.arange(length)
    dropped = (up == 0) & (j > 0) if separate_cls and truncate_seq else np.zeros(length, bool)
    assert ((up <= j) & (j < up + stride))[~dropped].all(), (length, stride, up)
    assert not dropped.any() or dropped[np.argmax(dropped):].all()  # only a tail is dropped


@pytest.mark.parametrize("block,pooling_layer", [(0, False), (1, True), (1, False), (2, True)])
def test_relative_shift_puts_each_distance_under_its_key(block, pooling_layer):
  """Scores against the distance list (largest first) -> scores against keys: entry [i, j] is
  the score of distance p_i - p_j, for the query / key positions of a block's layers
  (separate_cls + truncate_seq; the [CLS] row and column are zeroed by the cls mask)."""
  length = 19
  pos = list(range(length))
  keys = pos
  for b in range(1, block + 1):
    queries = [1 - 2 ** b] + keys[1:-1][::2]  # [CLS] sits before the first pooled window
    if b < block or not pooling_layer:
      keys = queries
  queries = keys if not pooling_layer else queries
  stride = 2 ** (block - 1) if pooling_layer else 2 ** block
  shift = 2 if pooling_layer else 1
  distances = fa.relative_distances(keys, stride, queries if pooling_layer else None, shift)
  np.testing.assert_array_equal(np.diff(distances), -stride)  # the stride grid, descending
  # score(i, d) = 1000 i + d, unique for every (row, distance).
  scores = (1000.0 * np.arange(len(queries))[:, None] + distances[None])[None, None]
  got = np.asarray(fa.relative_shift(scores, len(keys), shift))[0, 0]
  want = 1000.0 * np.arange(len(queries))[:, None] + (np.array(queries)[:, None]
                                                       - np.array(keys)[None])
  np.testing.assert_array_equal(got[1:, 1:], want[1:, 1:])


@pytest.mark.parametrize("separate_cls", [True, False])
def test_sequence_halves_per_block(separate_cls):
  """Each block runs at half the previous length (ceil; [CLS] kept), the decoder at the input's."""
  cfg = FunnelConfig(block_sizes=(1, 2, 1), num_decoder_layers=1, separate_cls=separate_cls,
                     d_model=16, n_head=2, d_head=4, d_inner=16, vocab_size=11).validated()
  model = Funnel(cfg)
  apply = functools.partial(model.apply, capture_intermediates=True)
  for length in (16, 21):
    ids = jax.ShapeDtypeStruct((2, length), np.int32)  # shapes only: traced, not compiled
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids)
    out, state = jax.eval_shape(apply, params, ids)
    inter = state["intermediates"]
    lengths = {name: v["__call__"][0].shape[1] for name, v in inter.items()
               if name.startswith(("blocks_", "decoder_"))}
    half = lambda n: (n + 1) // 2  # with truncation, [CLS] + (n - 2) tokens in pairs
    want = {"blocks_0_0": length, "blocks_1_0": half(length), "blocks_1_1": half(length),
            "blocks_2_0": half(half(length)), "decoder_0": length}
    assert lengths == want
    assert out["encoder_hidden"].shape == (2, half(half(length)), 16)
    assert out["hidden"].shape == (2, length, 16)


def config_module():
  spec = importlib.util.spec_from_file_location(
      "funnel_synthetic", os.path.join(REPO, "configs", "funnel_synthetic.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_funnel_trains_tiny(tmp_path):
  """configs/funnel_synthetic.py:test shrunk (two blocks of one layer, d_model 16, 16 tokens)
  through the main loop: the masked-token loss falls (8 symbols: ln 8 = 2.08 at chance)."""
  config = config_module().get_config("test")
  config.model.update(block_sizes=(1, 1), num_decoder_layers=1, d_model=16, n_head=2,
                      d_head=8, d_inner=32)
  config.data.seq_len = 16
  config.optimizer.update(lr=1e-2, min_lr=1e-3)
  config.train.update(num_steps=30, batch_size=16, log_every=10, eval_batches=1, eval_every=30)
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  train.train_and_evaluate(config, str(tmp_path / "run"))
  evals = [r["eval/loss"] for r in read_metrics(tmp_path / "run") if "eval/loss" in r]
  assert evals[0] > 2.5
  assert evals[-1] < 0.9 * evals[0]
  run = runs.restore_run(str(tmp_path / "run"))
  assert run.model_config.block_sizes == (1, 1) and run.params["mlm_bias"].shape == (16,)


@pytest.mark.slow  # a minute on a busy CPU; test_funnel_trains_tiny is the quick sibling
def test_funnel_trains_on_config(tmp_path):
  """configs/funnel_synthetic.py:test: accuracy well above chance (1/8); the trained run exports
  as transformers' FunnelForMaskedLM with the same logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from tfjax.hf import modalities  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  result = train.train_and_evaluate(config_module().get_config("test"), str(tmp_path / "run"))
  evals = [r["eval/loss"] for r in read_metrics(tmp_path / "run") if "eval/loss" in r]
  assert evals[-1] < 0.8 * evals[0]
  assert result["eval/accuracy"] > 0.25
  run = runs.restore_run(str(tmp_path / "run"))
  params = run.params
  modalities.export(run.model_config, params, str(tmp_path / "hf"))
  hf = transformers.FunnelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
  batch = run.dataset.train_batch(7, 8)
  with torch.no_grad():
    want = hf(torch.tensor(batch["inputs"]).long(),
              token_type_ids=torch.tensor(batch["token_type_ids"]).long()).logits.numpy()
  got = modalities.model(run.model_config).apply({"params": params}, batch["inputs"],
                                                 token_type_ids=batch["token_type_ids"])[
                                                     "mlm_logits"]
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_funnel_task_refuses_mismatched_configs():
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  config = config_module().get_config("test")
  config.model.mlm_head = False
  with pytest.raises(ValueError, match="set config.model.mlm_head=True"):
    experiment.prepare(config)
  config = config_module().get_config("test")
  config.data.seq_len = 2
  with pytest.raises(ValueError, match="too short for 3 funnel blocks"):
    experiment.prepare(config)
  config = config_module().get_config("test")
  config.model.vocab_size = 8
  with pytest.raises(ValueError, match="vocab_size=8 < 3 \\+ data.num_symbols=8"):
    experiment.prepare(config)
