"""tfjax/nn/kinds/bigbird.py: BigBird ITC block-sparse attention against a dense NumPy reference
(softmax over the full score matrix, keys weighted by how often the pattern lists them: 0 or 1
when the pattern has no repeats, i.e. the dense equivalent mask), its locality, its random-block
generator's properties, and the kind's validation, parameter and FLOP counts. Parity with
transformers: tests/hf/test_hf_bigbird.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_jit, random_params, tiny_config, to_numpy
from np_reference import rand
from tfjax.nn import attention_kinds
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.kinds import bigbird
from tfjax.training.accounting import flops
from tfjax.training.accounting import params as param_accounting

NAME = "bigbird"
B, R = 4, 1  # block size, random blocks: the shortest length is (6 + 2R) B = 32 tokens
BIGBIRD = dict(family="encoder", attention_kind="bigbird", bigbird_block_size=B,
               bigbird_num_random_blocks=R, max_len=64, position="none")


def np_counts(random_HxMxR, length, block):
  """[H, L, L] how many times query t's key list names key s, written from the paper's ITC
  pattern: blocks 0 and n-1 see all keys; block i sees the set {0, i-1, i, i+1, n-1} once and each
  of its random blocks once more."""
  heads = random_HxMxR.shape[0]
  n = length // block
  counts = np.zeros((heads, n, n))
  counts[:, [0, n - 1], :] = 1
  for h in range(heads):
    for i in range(1, n - 1):
      counts[h, i, sorted({0, i - 1, i, i + 1, n - 1})] = 1
      for j in random_HxMxR[h, i - 1]:
        counts[h, i, j] += 1
  return np.kron(counts, np.ones((block, block)))


def np_attention(q, k, v, counts, seg=None):
  """softmax(q k^T / sqrt(E)) v over [B, L, H, E] float64, each key weighted by counts [H, T, S];
  padding keys (segment 0) and other documents' keys dropped, padding queries zero."""
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
  logits = np.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1])
  weights = np.broadcast_to(counts[None], logits.shape).copy()
  if seg is not None:
    weights *= ((seg[:, None, :] == seg[:, :, None]) & (seg[:, None, :] != 0))[:, None]
  e = weights * np.exp(logits - logits.max(-1, keepdims=True))
  p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
  out = np.einsum("bhts,bshe->bthe", p, v)
  return out if seg is None else out * (seg != 0)[:, :, None, None]


def qkv(length, heads=2, kv_heads=2, dim=8, seed=0):
  return (rand((2, length, heads, dim), seed=seed), rand((2, length, kv_heads, dim), seed=seed + 1),
          rand((2, length, kv_heads, dim), seed=seed + 2))


def sparse(q, k, v, table, block=B, seg=None):
  """block_sparse_attention, compiled unoptimized (values, not speed, are tested)."""
  fn = lambda q, k, v, seg: bigbird.block_sparse_attention(
      q, k, v, table, block_size=block, q_segment_ids_BxL=seg, kv_segment_ids_BxL=seg)
  seg = None if seg is None else jnp.asarray(seg)
  return np.asarray(fast_jit(fn)(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), seg),
                    np.float64)


@pytest.mark.parametrize("length,kv_heads", [(40, 2), (64, 1)])
def test_block_sparse_equals_dense_masked_softmax(length, kv_heads):
  """The seeded pattern names each key block at most once per row, so the gathered computation
  is softmax attention under the dense 0/1 mask of global, window and random blocks."""
  q, k, v = qkv(length, kv_heads=kv_heads)
  table = bigbird.random_blocks(length, B, R, 2, 0, 64)
  counts = np_counts(table, length, B)
  assert set(np.unique(counts)) == {0.0, 1.0}
  expected = np_attention(*(np.float64(a) for a in (q, k, v)), counts)
  np.testing.assert_allclose(sparse(q, k, v, table), expected, rtol=1e-5, atol=1e-5)


def test_hf_evaluation_pattern_counts_block_zero_once_per_random_slot():
  """policy hf in evaluation: every random block is block 0 (transformers' model.eval()), which
  then weighs r + 1 times in rows 1..n-2."""
  length, r = 48, 2
  q, k, v = qkv(length, seed=3)
  table = np.zeros((2, length // B - 2, r), np.int32)
  counts = np_counts(table, length, B)
  assert counts[:, 2 * B, 0].tolist() == [1 + r] * 2
  expected = np_attention(*(np.float64(a) for a in (q, k, v)), counts)
  np.testing.assert_allclose(sparse(q, k, v, table), expected, rtol=1e-5, atol=1e-5)


def test_padding_and_documents_are_masked():
  length = 40
  q, k, v = qkv(length, seed=5)
  seg = np.ones((2, length), np.int32)
  seg[0, 30:] = 0            # right padding
  seg[1, 17:] = 2            # two documents in one row
  seg[1, 38:] = 0
  table = bigbird.random_blocks(length, B, R, 2, 4, 64)
  expected = np_attention(*(np.float64(a) for a in (q, k, v)), np_counts(table, length, B), seg)
  got = sparse(q, k, v, table, seg=jnp.asarray(seg))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  assert not got[0, 30:].any()


def test_a_query_block_reads_only_its_global_window_and_random_keys():
  """Changing keys and values outside query block i's key blocks leaves its output unchanged;
  changing one of its random blocks does not."""
  length, i = 48, 6
  q, k, v = qkv(length, heads=1, kv_heads=1, seed=7)
  table = bigbird.random_blocks(length, B, R, 1, 2, 64)
  seen = {0, i - 1, i, i + 1, length // B - 1} | set(table[0, i - 1].tolist())
  outside = [t for t in range(length) if t // B not in seen]
  assert outside
  k2, v2 = k.copy(), v.copy()
  k2[:, outside] += 3.0
  v2[:, outside] -= 2.0
  rows = slice(i * B, (i + 1) * B)
  base = sparse(q, k, v, table)
  np.testing.assert_array_equal(sparse(q, k2, v2, table)[:, rows], base[:, rows])
  assert not np.allclose(sparse(q, k2, v2, table)[:, :B], base[:, :B])  # global row reads all
  (j,) = table[0, i - 1]
  v3 = v.copy()
  v3[:, j * B:(j + 1) * B] += 1.0
  assert not np.allclose(sparse(q, k, v3, table)[:, rows], base[:, rows])


@pytest.mark.parametrize("length,block,r", [(48, 4, 1), (96, 4, 3), (160, 8, 2), (1024, 16, 3)])
def test_seeded_random_blocks_are_reproducible_and_avoid_window_and_globals(length, block, r):
  """Distinct, inside the sequence, outside the row's window and the global blocks (except the
  1024/3072/4096 plan, which transformers lets draw window blocks and the last block), and the
  same for the same seed; another seed gives another pattern."""
  n = length // block
  legacy = length in bigbird.LEGACY_LENGTHS
  table = bigbird.random_blocks(length, block, r, 3, 5, 4096)
  assert table.shape == (3, n - 2, r)
  assert table.min() >= 1 and table.max() <= (n - 1 if legacy else n - 2)
  np.testing.assert_array_equal(table, bigbird.random_blocks.__wrapped__(length, block, r, 3, 5,
                                                                         4096))
  assert not np.array_equal(table, bigbird.random_blocks(length, block, r, 3, 6, 4096))
  for h in range(3):
    for i in range(1, n - 1):
      row = table[h, i - 1].tolist()
      assert len(set(row)) == r
      if not legacy:
        assert not set(row) & {i - 1, i, i + 1}


def test_random_policies_seeded_and_hf():
  """seeded: the seeded table (seed + layer) in training and evaluation; hf: the same while
  training, block 0 everywhere in evaluation (transformers' model.eval())."""
  seeded = tiny_config(**BIGBIRD, bigbird_seed=2)
  hf = tiny_config(**BIGBIRD, bigbird_seed=2, bigbird_random="hf")
  table = bigbird.random_blocks(48, B, R, 2, 3, 64)  # layer 1: seed 2 + 1
  for cfg in (seeded, seeded.replace(deterministic=False), hf.replace(deterministic=False)):
    np.testing.assert_array_equal(bigbird.layer_random_blocks(cfg, 48, 1), table)
  np.testing.assert_array_equal(bigbird.layer_random_blocks(hf, 48, 1),
                                np.zeros((2, 10, R), np.int32))


def test_the_block_computes_block_sparse_attention_of_its_projections():
  """MultiHeadAttention with attention_kind='bigbird' is projections, the seeded pattern of its
  layer (seed + 0) and W_O, in NumPy."""
  cfg = tiny_config(**BIGBIRD, bigbird_seed=3)
  module = MultiHeadAttention(cfg)
  x = rand((2, 40, 16))
  params = random_params(module, x, seed=3, scale=0.4)
  got = np.asarray(fast_jit(lambda p, x: module.apply({"params": p}, x))(params, x))
  p, x64 = to_numpy(params), np.float64(x)
  proj = lambda name: np.einsum("btd,dhk->bthk", x64, p[name]["kernel"]) + p[name]["bias"]
  counts = np_counts(bigbird.random_blocks(40, B, R, 2, 3, 64), 40, B)
  o = np_attention(proj("query"), proj("key"), proj("value"), counts)
  expected = np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float32():
  """Scores and softmax in float32 whatever the input dtype."""
  q, k, v = qkv(48, seed=11)
  table = bigbird.random_blocks(48, B, R, 2, 0, 64)
  fn = lambda q, k, v: bigbird.block_sparse_attention(q, k, v, table, block_size=B)
  low = fast_jit(fn)(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)))
  assert low.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(low, np.float64), sparse(q, k, v, table), atol=3e-2)


def test_gradients_flow_and_are_finite_with_padding():
  q, k, v = (jnp.asarray(a) for a in qkv(40, seed=9))
  seg = jnp.asarray(np.r_[np.ones(33), np.zeros(7)].astype(np.int32)[None].repeat(2, 0))
  table = bigbird.random_blocks(40, B, R, 2, 0, 64)
  loss = lambda q, k, v: jnp.sum(bigbird.block_sparse_attention(
      q, k, v, table, block_size=B, q_segment_ids_BxL=seg, kv_segment_ids_BxL=seg) ** 2)
  grads = fast_jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  assert not np.asarray(grads[1])[:, 33:].any()  # padding keys get no gradient


@pytest.mark.parametrize("overrides,patterns", [
    (dict(family="decoder"), ["model.family='decoder'", "family='encoder'"]),
    (dict(scan_layers=True), ["scan_layers=False"]),
    (dict(max_len=24), ["model.max_len=24", "32", "never be sparse"]),
    (dict(bigbird_block_size=0), ["model.bigbird_block_size=0"]),
    (dict(bigbird_num_random_blocks=-1), ["model.bigbird_num_random_blocks=-1"]),
    (dict(bigbird_random="fresh"), ["model.bigbird_random='fresh'", "'seeded'", "'hf'"]),
    (dict(position="alibi"), ["model.position='alibi'", "bigbird"]),
    (dict(attention_dropout=0.1), ["model.attention_dropout=0.1", "bigbird"]),
])
def test_the_kind_rejects_what_it_cannot_compute(overrides, patterns):
  with pytest.raises(ValueError) as info:
    tiny_config(**{**BIGBIRD, **overrides})
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)


def test_a_long_sequence_off_the_block_grid_is_one_clear_error():
  module = MultiHeadAttention(tiny_config(**BIGBIRD))
  with pytest.raises(ValueError) as info:
    jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.ones((1, 38, 16))))
  for pattern in ("length 38", "bigbird_block_size=4", "= 28 tokens", "pad the sequences"):
    assert pattern in str(info.value), str(info.value)


def test_a_sequence_of_at_most_5_plus_2r_blocks_is_attended_in_full():
  """transformers' rule: (5 + 2r) b = 28 tokens or fewer take full softmax attention (also a
  length off the block grid)."""
  cfg = tiny_config(**BIGBIRD)
  module = MultiHeadAttention(cfg)
  for length in (28, 10):
    x = rand((2, length, 16), seed=length)
    params = random_params(module, x, seed=1, scale=0.4)
    p, x64 = to_numpy(params), np.float64(x)
    proj = lambda name: np.einsum("btd,dhk->bthk", x64, p[name]["kernel"]) + p[name]["bias"]
    o = np_attention(proj("query"), proj("key"), proj("value"), np.ones((2, length, length)))
    expected = np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]
    got = fast_jit(lambda p, x: module.apply({"params": p}, x))(params, x)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5)


def test_parameter_count_is_softmax_attentions_and_flops_are_linear_in_length():
  """No parameters of its own; FLOPs per token: 12 H E (2b + (1 - 2b/L)(5+r)b) per layer, which
  stays flat as L grows (softmax's grows as L), and 12 H E L where the length is attended in
  full."""
  cfg = tiny_config(**BIGBIRD, num_layers=2)
  softmax = tiny_config(family="encoder", max_len=64, position="none", num_layers=2)
  assert attention_kinds.ATTENTION_KINDS["bigbird"].params(cfg) == 0
  assert param_accounting.count_by_category(cfg) == param_accounting.count_by_category(softmax)
  n = param_accounting.analytic_count(cfg) - param_accounting.lookup_only_count(cfg)
  heads, dim, layers = 2, 8, 2
  for length in (32, 64):
    blocks = length // B
    pairs = 2 * B * length + (blocks - 2) * B * (5 + R) * B  # rows x keys computed
    assert flops.flops_per_token(cfg, length) == pytest.approx(
        6 * n + layers * 12 * heads * dim * pairs / length)
  assert flops.flops_per_token(cfg, 28) == pytest.approx(6 * n + layers * 12 * heads * dim * 28)
  big = cfg.replace(max_len=1 << 16)
  per_token = [flops.flops_per_token(big, length) for length in (4096, 8192)]
  assert per_token[1] / per_token[0] < 1.01


def test_an_mlm_encoder_with_bigbird_attention_trains(tmp_path):
  """train_and_evaluate on masked-LM text at 32 tokens (block-sparse: 8 blocks > 5 + 2r): the
  loss falls, and MFU counts the kind's FLOPs."""
  import run_helpers  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment, train  # pylint: disable=import-outside-toplevel
  config = run_helpers.tiny_config(num_steps=12, eval_every=12, log_every=1, checkpoint_every=12)
  path = tmp_path / "corpus.txt"
  rng = np.random.default_rng(0)
  path.write_text(" ".join("".join(rng.choice(list("abcde"), 4)) for _ in range(800)))
  config.task = "mlm"
  config.data.update(name="text", path=str(path), tokenizer="char", seq_len=32)
  config.model.update(family="encoder", mlm_head=True, position="learned", attention_kind=NAME,
                      bigbird_block_size=B, bigbird_num_random_blocks=R)
  config.train.peak_flops = 1e9  # CPUs are not in the peak table; a given peak turns MFU on
  workdir = str(tmp_path / "run")
  final = train.train_and_evaluate(config, workdir)
  rows = [m for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  losses = [m["train/loss"] for m in rows]
  assert np.isfinite(final["eval/loss"]) and np.mean(losses[-3:]) < np.mean(losses[:3]), losses
  model_cfg = experiment.prepare(config).model_config
  assert model_cfg.attention.kind == NAME and model_cfg.attention.kind_config.block_size == B
  n = param_accounting.analytic_count(model_cfg) - param_accounting.lookup_only_count(model_cfg)
  per_token = 6 * n + bigbird.flops_per_token(model_cfg, 32)  # one layer
  assert rows[-1]["train/mfu"] == pytest.approx(
      rows[-1]["train/tokens_per_sec"] * per_token / (1e9 * jax.device_count()), rel=1e-6)
