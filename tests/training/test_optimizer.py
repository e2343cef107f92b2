"""Schedules, weight-decay masks and the optimizer chain against formulas written out here."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tfjax.training.optim import optimizer as opt


def config(**overrides):
  # Not `defaults.update(...)`: ConfigDict would reject wrongly typed values before make_* does.
  return ml_collections.ConfigDict({**opt.default_optimizer_config().to_dict(), **overrides})


def lr_at(schedule, count):
  return float(schedule(count))


# --- schedules ------------------------------------------------------------------------------------


def test_rsqrt_matches_vaswani_eq3_and_peaks_at_warmup():
  d_model, warmup, lr_scale = 512, 40, 2.0
  schedule = opt.make_schedule(config(schedule="rsqrt", warmup_steps=warmup, lr_scale=lr_scale),
                               total_steps=1000, d_model=d_model)
  for count in (0, 1, 10, warmup - 1, warmup, 200, 999):
    step = count + 1
    expected = lr_scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    assert lr_at(schedule, count) == pytest.approx(expected, rel=1e-6)
  peak = lr_scale * d_model ** -0.5 * warmup ** -0.5
  values = np.asarray(schedule(jnp.arange(1000)))
  assert int(np.argmax(values)) == warmup - 1  # count warmup - 1 is update number `warmup`
  assert values.max() == pytest.approx(peak, rel=1e-6)


def test_cosine_warmup_peak_mid_and_end():
  lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
  schedule = opt.make_schedule(config(schedule="cosine", lr=lr, min_lr=min_lr,
                                      warmup_steps=warmup), total_steps=total)
  assert lr_at(schedule, 0) == pytest.approx(lr / warmup)  # first update: step 1 of the ramp
  assert lr_at(schedule, 4) == pytest.approx(lr * 5 / warmup)
  assert lr_at(schedule, warmup - 1) == pytest.approx(lr)  # peak on update number `warmup`
  mid_count = warmup + (total - warmup) // 2 - 1
  assert lr_at(schedule, mid_count) == pytest.approx((lr + min_lr) / 2)
  quarter = warmup + (total - warmup) // 4 - 1
  expected = min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * 0.25))
  assert lr_at(schedule, quarter) == pytest.approx(expected)
  assert lr_at(schedule, total - 1) == pytest.approx(min_lr)  # the last update of the run
  assert lr_at(schedule, total + 50) == pytest.approx(min_lr)


def test_linear_and_constant():
  lr, min_lr, warmup, total = 2e-3, 0.0, 4, 24
  linear = opt.make_schedule(config(schedule="linear", lr=lr, min_lr=min_lr, warmup_steps=warmup),
                             total_steps=total)
  assert lr_at(linear, 1) == pytest.approx(lr * 2 / warmup)
  assert lr_at(linear, warmup - 1) == pytest.approx(lr)
  assert lr_at(linear, warmup + 10 - 1) == pytest.approx(lr / 2)
  assert lr_at(linear, total - 1) == pytest.approx(min_lr, abs=1e-12)
  constant = opt.make_schedule(config(schedule="constant", lr=lr, warmup_steps=warmup),
                               total_steps=total)
  assert lr_at(constant, 0) == pytest.approx(lr / warmup)
  for count in (warmup - 1, warmup, total - 1, 10 * total):
    assert lr_at(constant, count) == pytest.approx(lr)
  no_warmup = opt.make_schedule(config(schedule="constant", lr=lr, warmup_steps=0), total)
  assert lr_at(no_warmup, 0) == pytest.approx(lr)


def test_schedule_is_jittable():
  schedule = opt.make_schedule(config(), total_steps=1000)
  assert float(jax.jit(schedule)(jnp.int32(99))) == pytest.approx(lr_at(schedule, 99))


# --- weight-decay mask ----------------------------------------------------------------------------


def hand_built_params():
  return {
      "layers_0": {
          "attention": {"query": {"kernel": np.ones((4, 4)), "bias": np.ones(4)}},
          "pre_attention_norm": {"scale": np.ones(4)},
          "mlp": {"wi": {"kernel": np.ones((4, 8)), "bias": np.ones(8)}},
      },
      "final_norm": {"scale": np.ones(4), "bias": np.ones(4)},
      "embed": {"embedding": np.ones((10, 4))},
      "pos_embedding": np.ones((6, 4)),
      "head": {"kernel": np.ones((4, 10))},
  }


def box(tree):
  return jax.tree.map(lambda x: nn.LogicallyPartitioned(jnp.asarray(x), ("a",) * x.ndim), tree)


def flat_mask(mask):
  unboxed = nn.meta.unbox(mask)
  paths_and_flags, _ = jax.tree_util.tree_flatten_with_path(unboxed)
  return {"/".join(k.key for k in path): flag for path, flag in paths_and_flags}


DECAYED_ALWAYS = {"layers_0/attention/query/kernel", "layers_0/mlp/wi/kernel", "head/kernel"}
NORMS = {"layers_0/pre_attention_norm/scale", "final_norm/scale", "final_norm/bias"}
BIASES = {"layers_0/attention/query/bias", "layers_0/mlp/wi/bias", "final_norm/bias"}
EMBEDDINGS = {"embed/embedding", "pos_embedding"}


@pytest.mark.parametrize("boxed", [False, True], ids=["unboxed", "boxed"])
@pytest.mark.parametrize("exclude", [("norms", "biases", "embeddings"), ("biases",),
                                     ("norms",), ("embeddings",), ()])
def test_weight_decay_mask_excludes_exactly(boxed, exclude):
  params = box(hand_built_params()) if boxed else hand_built_params()
  mask = opt.weight_decay_mask(params, exclude)
  assert jax.tree.structure(mask) == jax.tree.structure(params)
  excluded = set()
  for name, group in (("norms", NORMS), ("biases", BIASES), ("embeddings", EMBEDDINGS)):
    if name in exclude:
      excluded |= group
  flags = flat_mask(mask)
  assert {path for path, decays in flags.items() if not decays} == excluded
  assert DECAYED_ALWAYS <= {path for path, decays in flags.items() if decays}


def test_decay_exclude_accepts_comma_string_and_rejects_unknown():
  flags = flat_mask(opt.weight_decay_mask(hand_built_params(), "norms, biases"))
  assert {p for p, d in flags.items() if not d} == NORMS | BIASES
  opt.make_optimizer(config(decay_exclude="norms,biases"), total_steps=10)  # e.g. from a flag
  with pytest.raises(ValueError, match=r"decay_exclude.*'layers'.*norms"):
    opt.weight_decay_mask(hand_built_params(), ("layers",))


# --- the optimizer chain against NumPy ------------------------------------------------------------


def numpy_adam(params, grads_per_step, lrs, *, b1, b2, eps, weight_decay, mask, coupled=False,
               clip_norm=None):
  """Reference Adam/AdamW on flat dicts of arrays; `mask` marks leaves that decay."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
    if clip_norm:
      norm = math.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
      g = {k: x * min(1.0, clip_norm / norm) for k, x in g.items()}
    if coupled:
      g = {k: x + weight_decay * p[k] * mask[k] for k, x in g.items()}
    for k in p:
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
      m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
      step = m_hat / (np.sqrt(v_hat) + eps)
      if not coupled:
        step = step + weight_decay * p[k] * mask[k]
      p[k] = p[k] - lr * step
  return p


def run_optimizer(tx, params, grads_per_step):
  state = tx.init(params)
  for grads in grads_per_step:
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params


def flat(tree):
  return {k: np.asarray(v) for k, v in flat_mask(nn.meta.unbox(tree)).items()}


def random_like(tree, key, scale=1.0):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return treedef.unflatten([scale * jax.random.normal(k, jnp.shape(x)) for k, x in
                            zip(keys, leaves)])


@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("boxed", [False, True], ids=["unboxed", "boxed"])
def test_three_steps_match_numpy(name, boxed):
  params = random_like(nn.meta.unbox(hand_built_params()), jax.random.key(0))
  grads = [random_like(params, jax.random.key(s), scale=s) for s in (1, 2, 3)]
  hyper = dict(b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.1)
  c = config(name=name, schedule="cosine", lr=1e-2, min_lr=1e-3, warmup_steps=2, clip_norm=0.0,
             **hyper)
  wrap = box if boxed else (lambda t: t)
  tx, schedule = opt.make_optimizer(c, total_steps=5, d_model=4, params=wrap(params))
  got = run_optimizer(tx, wrap(params), [wrap(g) for g in grads])
  if boxed:
    assert isinstance(got["head"]["kernel"], nn.LogicallyPartitioned)
  mask = {k: float(v) for k, v in flat_mask(opt.weight_decay_mask(params)).items()}
  expected = numpy_adam(flat(params), [flat(g) for g in grads], [lr_at(schedule, t) for t in
                        range(3)], mask=mask, coupled=(name == "adam"), **hyper)
  for key, value in flat(got).items():
    np.testing.assert_allclose(value, expected[key], rtol=2e-5, atol=1e-7, err_msg=key)
  # Excluded leaves really were left out of the decay: compare against no decay at all.
  undecayed = numpy_adam(flat(params), [flat(g) for g in grads], [lr_at(schedule, t) for t in
                         range(3)], mask=mask, coupled=(name == "adam"), **{**hyper,
                                                                              "weight_decay": 0.0})
  for key, value in flat(got).items():
    same = np.allclose(value, undecayed[key], rtol=1e-6, atol=0)
    assert same == (mask[key] == 0.0), key


def test_global_norm_clipping():
  params = {"w": jnp.ones((3,)), "b": jnp.zeros((2,))}
  # Step 1 is clipped (norm 10 -> 1), step 2 is not (norm 0.5); Adam's result depends on the ratio.
  grads = [{"w": jnp.array([6.0, 0.0, 0.0]), "b": jnp.array([0.0, 8.0])},
           {"w": jnp.array([0.3, 0.0, 0.0]), "b": jnp.array([0.4, 0.0])}]
  hyper = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
  c = config(schedule="constant", warmup_steps=0, lr=0.1, clip_norm=1.0, **hyper)
  tx, _ = opt.make_optimizer(c, total_steps=10)
  got = run_optimizer(tx, params, grads)
  np_grads = [{k: np.asarray(v) for k, v in g.items()} for g in grads]
  mask = {"w": 1.0, "b": 1.0}
  np_params = {k: np.asarray(v) for k, v in params.items()}
  clipped = numpy_adam(np_params, np_grads, [0.1, 0.1], mask=mask, clip_norm=1.0, **hyper)
  unclipped = numpy_adam(np_params, np_grads, [0.1, 0.1], mask=mask, **hyper)
  for k in params:
    np.testing.assert_allclose(got[k], clipped[k], rtol=1e-5, atol=1e-7)
  # w[0] sees both steps, so clipping step 1 changes how much step 2 moves it.
  assert not np.allclose(got["w"], unclipped["w"], rtol=1e-3)


# --- config validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("key,value,valid", [
    ("schedule", "exponential", "rsqrt"),
    ("name", "sgd", "adamw"),
    ("grad_accum_steps", 0, "int >= 1"),
    ("clip_norm", -1.0, "0/None"),
    ("warmup_steps", 10.0, "int >= 0"),
    ("decay_exclude", ("bias",), "'norms', 'biases', 'embeddings'"),
])
def test_bad_values_name_key_value_and_choices(key, value, valid):
  with pytest.raises(ValueError) as err:
    opt.make_optimizer(config(**{key: value}), total_steps=10, d_model=8)
  message = str(err.value)
  assert f"{key}={value!r}" in message and valid in message


def test_unknown_key_and_rsqrt_without_d_model():
  c = opt.default_optimizer_config().to_dict()
  c["warmup_step"] = 10
  with pytest.raises(ValueError, match=r"warmup_step.*valid keys"):
    opt.make_optimizer(c, total_steps=10)
  with pytest.raises(ValueError, match="d_model"):
    opt.make_schedule(config(schedule="rsqrt"), total_steps=10)
  with pytest.raises(ValueError, match=r"warmup_steps=0.*rsqrt"):
    opt.make_schedule(config(schedule="rsqrt", warmup_steps=0), total_steps=10, d_model=8)


def test_default_config_has_documented_defaults():
  c = opt.default_optimizer_config()
  assert (c.name, c.lr, c.b1, c.b2, c.eps, c.weight_decay) == ("adamw", 1e-3, 0.9, 0.999, 1e-8, 0.0)
  assert tuple(c.decay_exclude) == ("norms", "biases", "embeddings")
  assert (c.clip_norm, c.schedule, c.warmup_steps, c.min_lr, c.grad_accum_steps) == (
      1.0, "cosine", 100, 1e-4, 1)
