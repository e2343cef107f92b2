"""configs/ablations/*.py: every arm differs from its ablation's baseline only in the keys the
module documents (ARM_KEYS), every scale's points are valid and its docstring gives the command,
the position ablations give every arm its paper's embedding defaults, and each arm added for issue 18
trains: a few Adam steps of its model (shrunk) lower the loss on a fixed batch."""

import glob
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import fast_jit
from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model
from tfjax.research import sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABLATIONS = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "ablations", "*.py"))
                   if not os.path.basename(p).startswith("_"))
SCALES = ("smoke", "medium", "full")


def _flat(config) -> dict:
  out = {}

  def walk(tree, prefix):
    for key, value in tree.items():
      if isinstance(value, dict):
        walk(value, f"{prefix}{key}.")
      else:
        out[prefix + key] = value
  walk(config.to_dict(), "")
  return out


@pytest.mark.parametrize("path", ABLATIONS, ids=os.path.basename)
def test_arms_differ_from_the_baseline_only_in_documented_keys(path):
  module = sweep.load_module(path)
  name = os.path.basename(path)
  assert ABLATIONS  # discovered: every configs/ablations/*.py not starting with '_'
  used = set()
  for scale in SCALES:
    s = sweep.load_sweep(path, scale)  # validates every point's model config
    base = _flat(s.base_config)
    for point in s.points:
      config = _flat(s.config_for(point))
      assert set(config) == set(base), point.name
      changed = {k for k in base if config[k] != base[k]} - set(sweep.SEED_KEYS)
      assert changed <= set(module.ARM_KEYS), (name, scale, point.name, changed)
      used |= changed
    doc = module.get_config.__doc__
    assert f"--config=configs/ablations/{name} --scale=medium" in doc
    assert "Expected runtime" in doc
  assert used == set(module.ARM_KEYS), (name, used)  # every documented key is an arm somewhere


@pytest.mark.parametrize("path", ABLATIONS, ids=os.path.basename)
def test_every_plot_line_pools_only_seeds(path):
  """Each drawn mean ± std pools points that differ only in their seed: within one line, panel
  and x value of a plot, after its `where`, no two points differ in another override (else the
  error bars would mix arms, or count one seed's value twice, as pooling over a key that does not
  change the metric would). A `where` that matches no point is an error of its own."""
  from tfjax.research import sweep_report  # pylint: disable=import-outside-toplevel
  for scale in SCALES:
    s = sweep.load_sweep(path, scale)
    rows = [{"overrides": p.overrides, "status": "done"} for p in s.points]
    for spec in s.report.get("plots", ()):
      kept = sweep_report.select(rows, spec)
      assert kept, (scale, spec.get("file"))
      # What plot() pools into one drawn point: rows equal in the lines, x and the panel key.
      keys = [k for k in sweep_report.variant_keys(kept)
              if k in {*sweep_report.line_keys(spec, kept), spec.get("x"), spec.get("panels")}]
      for values, members in sweep_report.group(kept, keys):
        others = {tuple(sorted((k, str(v)) for k, v in m["overrides"].items()
                               if k not in set(sweep.SEED_KEYS) | set(keys)))
                  for m in members}
        assert len(others) == 1, (scale, spec.get("file"), values, sorted(others))


@pytest.mark.parametrize("name,scaled", [("position.py", True), ("position_lengthgen.py", False)])
def test_position_arms_share_their_papers_embedding_protocol(name, scaled):
  """The arms differ in the position encoding alone, under the compared papers' protocol:
  position.py scales every arm's tokens by sqrt(d_model) (Vaswani et al. section 3.4, for both
  rows of table 3 compared; fairseq's default under Press et al.), position_lengthgen.py scales
  none (Kazemnejad et al. swap only the encoding); T5's bias uses the T5 paper's 32 buckets up to
  an offset of 128 (Raffel et al. 2020, section 2.1), the last bucket holding offsets >= 128."""
  from tfjax.nn.relative_bias import relative_position_bucket  # pylint: disable=import-outside-toplevel
  for scale in SCALES:
    s = sweep.load_sweep(os.path.join(REPO, "configs", "ablations", name), scale)
    positions = set()
    for point in s.points:
      config = s.config_for(point)
      model = config.model
      assert model.embed_scale is scaled, point.name
      # One extra learned arm starts its table at fairseq's std d^-0.5; every other keeps 0.02.
      assert model.position_init_std is None or (
          model.position == "learned"
          and model.position_init_std == pytest.approx(model.d_model ** -0.5, rel=1e-5)), point.name
      assert model.relative_max_distance == 128 and model.relative_buckets == 32, point.name
      if model.position == "t5_bias":
        offsets = -np.array([0, 15, 16, 64, 128, 1000])  # causal: keys at or before the query
        buckets = np.asarray(relative_position_bucket(
            jnp.asarray(offsets), bidirectional=False, num_buckets=model.relative_buckets,
            max_distance=model.relative_max_distance)).tolist()
        # 16 exact offsets, then 16 log-spaced buckets to 128: 64 -> 16 + int(16 log(64/16) /
        # log(128/16)) = 26; 128 and beyond share the last bucket.
        assert buckets == [0, 15, 16, 26, 31, 31], buckets
      positions.add(model.position)
    assert positions == {"none", "learned", "sinusoidal", "rope", "alibi", "t5_bias"}


# The arms issue 18 added, each as (ablation, the point's non-seed overrides).
NEW_ARMS = [
    ("position.py", {"model.position": "t5_bias"}),
    ("norm.py", {"model.norm_placement": "sandwich"}),
    ("norm.py", {"model.norm_placement": "deepnorm", "optimizer.warmup_steps": 0}),
    ("norm.py", {"model.qk_norm": "rmsnorm", "model.norm_placement": "post"}),
    ("norm.py", {"model.init": "xavier_uniform", "model.norm_placement": "post"}),
    ("ffn.py", {"model.ffn": "silu", "model.d_ff": 384}),
    ("ffn.py", {"model.ffn": "glu", "model.d_ff": 256}),
    ("ffn.py", {"model.ffn": "bilinear", "model.d_ff": 256}),
    ("ffn.py", {"model.ffn": "reglu", "model.d_ff": 256}),
    ("heads.py", {"model.num_heads": 32}),
    ("heads.py", {"model.num_heads": 8, "model.head_dim": 16}),
]


@pytest.mark.parametrize("name,overrides", NEW_ARMS,
                         ids=[f"{n[:-3]}-{'-'.join(map(str, o.values()))}" for n, o in NEW_ARMS])
def test_new_arm_trains(name, overrides):
  s = sweep.load_sweep(os.path.join(REPO, "configs", "ablations", name), "smoke")
  point = [p for p in s.points if p.overrides.get("seed") == 0 and all(
      p.overrides.get(k) == v for k, v in overrides.items())][0]
  model = dict(s.config_for(point).model)
  # Shrunk to test size, the arm's switches kept: 1 layer of width 48-64 over 13 symbols.
  gated = model["d_ff"] < 4 * model["d_model"]
  model.update(vocab_size=13, num_layers=1, d_model=64 if model["num_heads"] > 8 else 48,
               d_ff=64 if gated else 96)
  if model["head_dim"] is not None:
    model["num_heads"] = 2
  cfg = ModelConfig.from_config(model)
  net = build_model(cfg)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(0, 13, (4, 16)), jnp.int32)
  targets = jnp.roll(inputs, -1, axis=1)
  tx = optax.adam(1e-2)

  def train(key):  # init and 4 Adam steps in one program: one (fast) compile per arm
    params = net.init(key, inputs)["params"]

    def loss_fn(p):
      logits = net.apply({"params": p}, inputs)
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def step(carry, _):
      params, opt_state = carry
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    return jax.lax.scan(step, (params, tx.init(params)), None, length=4)[1]

  losses = [float(x) for x in fast_jit(train)(jax.random.PRNGKey(0))]
  assert all(math.isfinite(x) for x in losses), losses
  assert losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("path", ABLATIONS, ids=os.path.basename)
def test_report_functions_the_configs_call_exist(path):
  """evaluate_point hooks call tfjax.research modules by attribute (sweep_report.read_point):
  every such name must exist, or each point fails only after training."""
  import importlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  source = open(path, encoding="utf-8").read()
  for module, name in re.findall(r"\b(sweep_report|sweep_tables|length_eval|grad_norms)\.(\w+)\(",
                                 source):
    assert hasattr(importlib.import_module(f"tfjax.research.{module}"), name), (module, name)
