"""tfjax/nn/attention_kinds.py: a new attention kind is one registration, made here from the test
file alone (no library file names it), and the model, validation, parameter counts, FLOPs / MFU
and the training loop all take it."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import run_helpers
from conftest import random_params, tiny_config, to_numpy
from np_reference import rand
from tfjax.nn import attention_kinds, axes
from tfjax.nn import config as config_module
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.sections import Section, flat_key
from tfjax.nn.softmax_attention import SOFTMAX
from tfjax.training.accounting import flops
from tfjax.training.loop import experiment, train
from tfjax.training.accounting import params as param_accounting

TOY = "toy_linear"


def toy_attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias):
  """Causal linear attention (Katharopoulos et al. 2020), feature map phi = elu + 1, with a
  learned per-head gain exp(g_h) on the query features: out_t = sum_{s<=t} (phi(q_t).phi(k_s))
  v_s / sum_{s<=t} phi(q_t).phi(k_s), as running sums over the keys (no T x S scores). Rows hold
  one sequence each: padding keys (segment id 0) are dropped from the sums."""
  del logits_bias  # the kind takes none (logits_bias=False rejects ALiBi and T5)
  heads = q_BxTxHxE.shape[2]
  gain_init = owner.config.attention.kind_config.log_gain_init  # the kind's own config key
  log_gain_H = owner.param("toy_log_gain", nn.with_logical_partitioning(
      nn.initializers.constant(gain_init), (axes.HEADS,)), (heads,))
  q_feat_BxTxHxE = (jax.nn.elu(q_BxTxHxE.astype(jnp.float32)) + 1.0) * jnp.exp(log_gain_H)[:, None]
  k_feat_BxSxHxE = jax.nn.elu(k_BxSxKxE.astype(jnp.float32)) + 1.0
  if visibility.kv_segment_ids_BxS is not None:
    k_feat_BxSxHxE = k_feat_BxSxHxE * (visibility.kv_segment_ids_BxS != 0)[:, :, None, None]
  state_BxSxHxExE = jnp.cumsum(
      jnp.einsum("bshe,bshf->bshef", k_feat_BxSxHxE, v_BxSxKxE.astype(jnp.float32)), axis=1)
  norm_BxSxHxE = jnp.cumsum(k_feat_BxSxHxE, axis=1)
  num_BxTxHxE = jnp.einsum("bthe,bthef->bthf", q_feat_BxTxHxE, state_BxSxHxExE)
  den_BxTxH = jnp.einsum("bthe,bthe->bth", q_feat_BxTxHxE, norm_BxSxHxE)
  return (num_BxTxHxE / den_BxTxH[..., None]).astype(q_BxTxHxE.dtype)


def toy_flops(cfg, seq_len):
  """k v^T, its running sum, q S and the normalizer: ~4 E^2 per head forward, x3 with backward;
  no seq_len term."""
  del seq_len
  return 12.0 * cfg.attention.num_heads * cfg.dim_per_head ** 2


def toy_check(cfg):
  attention = cfg.attention
  if (cfg.family != "decoder" or attention.window is not None
      or attention.kv_heads != attention.num_heads):
    raise ValueError(f"model.attention_kind={TOY!r} is causal self-attention over every earlier "
                     "key with num_kv_heads = num_heads: use family='decoder', no window, no GQA")


@dataclasses.dataclass(frozen=True)
class ToyConfig(Section):
  """The toy kind's own config key, declared with the kind (no library file names it)."""
  log_gain_init: float = flat_key("toy_linear_log_gain_init", 0.0)

  def validate(self, model) -> None:
    if not abs(self.log_gain_init) < 10:
      raise ValueError(f"model.toy_linear_log_gain_init={self.log_gain_init} must lie in "
                       "(-10, 10): exp of it scales the query features")


@pytest.fixture
def toy_kind():
  kind = attention_kinds.register_attention_kind(attention_kinds.AttentionKind(
      TOY, attend=toy_attend, flops_per_token=toy_flops, params=lambda cfg: cfg.attention.num_heads,
      check=toy_check, section=ToyConfig))
  yield kind
  del attention_kinds.ATTENTION_KINDS[TOY]


def test_a_kinds_own_config_keys_are_config_model_keys_read_by_that_kind_only(toy_kind):
  """The kind's section joins config.model (with its default, settable like any key), the block
  reads it as cfg.attention.kind_config, its validation runs, and another kind rejects it."""
  key = "toy_linear_log_gain_init"
  assert key in config_module.FLAT_KEYS
  model = config_module.default_model_config()
  assert model[key] == 0.0
  model.attention_kind, model[key], model.position = TOY, 0.5, "none"
  cfg = config_module.ModelConfig.from_config(model)
  assert cfg.attention.kind_config == ToyConfig(0.5) and cfg.to_flat()[key] == 0.5
  params = nn.meta.unbox(MultiHeadAttention(cfg, causal=True).init(
      jax.random.PRNGKey(0), rand((1, 4, cfg.d_model))))
  np.testing.assert_array_equal(np.asarray(params["params"]["toy_log_gain"]),
                                np.full(cfg.attention.num_heads, 0.5))
  assert tiny_config().attention.kind_config is None  # softmax declares no section
  with pytest.raises(ValueError) as info:
    tiny_config(**{key: 0.5})  # softmax does not read it
  for pattern in (f"model.{key}=0.5", f"attention_kind='{TOY}' only", "'softmax'", "0.0"):
    assert pattern in str(info.value), str(info.value)
  with pytest.raises(ValueError, match=rf"model.{key}=12.0 must lie in"):
    tiny_config(attention_kind=TOY, position="none", **{key: 12.0})
  with pytest.raises(AttributeError, match=r"cfg.attention.kind_config.log_gain_init"):
    getattr(cfg, key)
  with pytest.raises(TypeError, match=rf"declares config keys \['{key}'\]"):
    attention_kinds.register_attention_kind(dataclasses.replace(toy_kind, name="toy_clone"))
  assert "toy_clone" not in attention_kinds.ATTENTION_KINDS


def test_an_unregistered_kinds_keys_leave_config_model():
  assert "toy_linear_log_gain_init" not in config_module.FLAT_KEYS
  assert "toy_linear_log_gain_init" not in config_module.default_model_config()
  with pytest.raises(ValueError, match="unknown model config key"):
    config_module.ModelConfig.from_flat({"toy_linear_log_gain_init": 0.5})


def np_linear_attention(p, x):
  """The toy kind's block from its formula: projections, quadratic-form causal linear attention
  with the per-head gain, output projection. [B, T, D] float64."""
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  phi = lambda a: np.where(a > 0, a + 1.0, np.exp(a))  # elu + 1
  q_feat = phi(q) * np.exp(p["toy_log_gain"])[:, None]
  scores = np.einsum("bthe,bshe->bhts", q_feat, phi(k))
  scores = scores * np.tril(np.ones((x.shape[1], x.shape[1])))
  o = np.einsum("bhts,bshe->bthe", scores, v) / scores.sum(-1).transpose(0, 2, 1)[..., None]
  return np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_softmax_is_the_default_kind_and_unknown_kinds_name_the_registered_ones(toy_kind):
  assert attention_kinds.attention_kind(tiny_config()) is SOFTMAX
  assert attention_kinds.attention_kind(tiny_config(attention_kind=TOY)) is toy_kind
  with pytest.raises(ValueError) as info:
    tiny_config(attention_kind="linear")
  for pattern in ("model.attention_kind='linear'", "'softmax'", f"'{TOY}'"):
    assert pattern in str(info.value), str(info.value)


@pytest.mark.parametrize("overrides,patterns", [
    (dict(position="alibi"), ["model.position='alibi'", TOY]),
    (dict(position="t5_bias"), ["model.position='t5_bias'", TOY]),
    (dict(attention_softcap=30.0), ["model.attention_softcap=30.0", TOY, "None"]),
    (dict(decode=True), [TOY, "decode=True"]),
    (dict(num_kv_heads=1), [TOY, "num_kv_heads"]),  # the kind's own check
])
def test_a_kind_rejects_what_it_cannot_compute(toy_kind, overrides, patterns):
  del toy_kind
  with pytest.raises(ValueError) as info:
    tiny_config(attention_kind=TOY, **overrides)
  for pattern in patterns:
    assert pattern in str(info.value), str(info.value)


def test_the_block_computes_the_registered_math(toy_kind):
  del toy_kind
  cfg = tiny_config(attention_kind=TOY, position="none")
  module = MultiHeadAttention(cfg, causal=True)
  x = rand((2, 6, 16))
  params = random_params(module, x, seed=3, scale=0.4)
  y = np.asarray(module.apply({"params": params}, x))
  np.testing.assert_allclose(y, np_linear_attention(to_numpy(params), np.asarray(x, np.float64)),
                             rtol=2e-5, atol=2e-5)


def test_parameter_and_flop_counts_take_the_kinds_own(toy_kind):
  """The module count (eval_shape) equals the closed form plus the kind's H gains, and FLOPs per
  token are 6N plus the kind's count per layer: flat in the context length."""
  del toy_kind
  cfg = tiny_config(attention_kind=TOY, position="none", num_layers=2)
  softmax = tiny_config(position="none", num_layers=2)
  counts = param_accounting.count_by_category(cfg)
  assert counts["attention"] == param_accounting.count_by_category(softmax)["attention"] + 2 * 2
  assert param_accounting.analytic_count(cfg) == sum(counts.values())
  heads, head_dim, layers = 2, 8, 2  # TINY: d_model 16 over 2 heads
  assert (cfg.attention.num_heads, cfg.dim_per_head) == (heads, head_dim)
  n = param_accounting.analytic_count(cfg) - param_accounting.lookup_only_count(cfg)
  for seq_len in (16, 4096):
    assert flops.flops_per_token(cfg, seq_len) == 6 * n + layers * 12 * heads * head_dim ** 2


def test_a_kind_registered_in_a_test_trains_through_the_training_loop(toy_kind, tmp_path):
  """train_and_evaluate on the copy task: the loss falls, and MFU counts the kind's FLOPs."""
  del toy_kind
  config = run_helpers.tiny_config(num_steps=12, eval_every=12, checkpoint_every=12)
  config.model.attention_kind = TOY
  config.model.toy_linear_log_gain_init = 0.25  # the kind's own key, as --config.model.X sets it
  config.data.test_lengths = (8,)  # one eval program: the kind's training is what's tested
  config.train.peak_flops = 1e9  # CPUs are not in the peak table; a given peak turns MFU on
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  rows = [m for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  losses = [m["train/loss"] for m in rows]
  assert len(losses) == 12 and all(np.isfinite(losses))
  assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
  model_cfg = experiment.prepare(config).model_config
  n = param_accounting.analytic_count(model_cfg) - param_accounting.lookup_only_count(model_cfg)
  heads, head_dim = 2, 16  # run_helpers' d_model=32, num_heads=2
  per_token = 6 * n + 1 * 12 * heads * head_dim ** 2  # one layer; no seq_len term
  last = rows[-1]
  assert last["train/mfu"] == pytest.approx(
      last["train/tokens_per_sec"] * per_token / (1e9 * jax.device_count()), rel=1e-6)


def test_export_to_hugging_face_refuses_a_kind_it_cannot_express(toy_kind):
  """HF conversion maps softmax attention only: the exporter's config round trip names the key."""
  del toy_kind
  from tfjax.hf import exporter, mapping, registry  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(attention_kind=TOY, position="rope", ffn="swiglu", ffn_bias=False,
                    attention_bias=False, norm="rmsnorm", tie_embeddings=False)
  with pytest.raises(mapping.UnsupportedError, match="attention_kind"):
    exporter.hf_config(registry.architecture("llama"), cfg, set())
