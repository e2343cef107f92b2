"""tfjax/training/parallel/cpu_fusion.py: the setup-time CPU fusion policy reaches the jitted
step."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FAST_COMPILE, random_params, tiny_config
from np_reference import rand
from run_helpers import one_device_placement
from run_helpers import tiny_config as tiny_run_config

from tfjax.nn.layers import TransformerLayer
from tfjax.training.loop import experiment
from tfjax.training.parallel import cpu_fusion

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")



def test_train_step_gets_the_cpu_fusion_boundary_the_config_asks_for():
  """train.cpu_fusion reaches the jitted train step: 'on' routes each sublayer's residual-stream
  cotangent through a cond (tfjax/training/parallel/cpu_fusion.py), 'off' leaves none; the loss is the same."""
  config = tiny_run_config()
  placement = one_device_placement(config)
  conds, losses = {}, {}
  try:
    for policy in ("on", "off"):
      config.train.cpu_fusion = policy
      exp = experiment.prepare(config)
      layout = experiment.state_layout(exp, placement)
      step = experiment.jit_train_step(exp, placement, layout.shardings)
      batch = placement.put(exp.dataset.train_batch(0, 8))
      with placement.axis_rules():
        conds[policy] = str(jax.make_jaxpr(step)(layout.abstract, batch)).count("cond[")
        state = layout.init()  # the loss alone compares values: compiled unoptimized, faster
        losses[policy] = float(step.lower(state, batch).compile(FAST_COMPILE)(state, batch)[1][
            "train/loss"])
  finally:
    cpu_fusion.install("auto")
  assert conds["off"] == 0 and conds["on"] >= 2, conds  # 1 layer: attention and FFN sublayers
  assert losses["on"] == pytest.approx(losses["off"], rel=1e-6)


def _conds(jaxpr) -> int:
  """Number of `cond` equations in a closed jaxpr, nested ones included."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "cond"
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      count += _conds(sub)
  return count


@pytest.mark.parametrize("cross", [False, True])
def test_cpu_fusion_boundary_is_one_cond_per_sublayer_and_changes_no_value(cross, fusion_policy):
  """cpu_fusion.applied routes the residual stream entering each sublayer through an identity
  whose cotangent passes a cond: conds in the gradient for each sublayer ('on'), none ('off'), the
  same gradients either way; forward-mode autodiff still works through it."""
  cfg = tiny_config(num_heads=4, num_kv_heads=2)
  x = jnp.asarray(rand((2, 5, 16), seed=40))
  enc = jnp.asarray(rand((2, 3, 16), seed=41))
  cot = jnp.asarray(rand((2, 5, 16), seed=42))
  layer = TransformerLayer(cfg, causal=True, cross_attention=cross)
  params = random_params(layer, x, None, None, enc, seed=43)
  # A new function per policy: JAX caches traces by function, and the policy is read when tracing.
  loss = lambda: cpu_fusion.applied(lambda p, x: jnp.sum(
      layer.apply({"params": p}, x, encoded_BxSxD=enc) * cot))
  grads, conds = {}, {}
  for policy in ("on", "off"):
    fusion_policy(policy)
    conds[policy] = _conds(jax.make_jaxpr(jax.grad(loss(), argnums=(0, 1)))(params, x).jaxpr)
    grads[policy] = jax.grad(loss(), argnums=(0, 1))(params, x)
  # Partial evaluation splits each sublayer's cond into a forward and a (transposed) backward one.
  sublayers = 3 if cross else 2
  assert conds == {"on": 2 * sublayers, "off": 0}
  for a, b in zip(jax.tree_util.tree_leaves(grads["on"]), jax.tree_util.tree_leaves(grads["off"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  fusion_policy("on")
  dx = jnp.asarray(rand((2, 5, 16), seed=44))
  f = loss()
  _, tangent = jax.jvp(lambda x: f(params, x), (x,), (dx,))
  assert float(tangent) == pytest.approx(float(jnp.sum(grads["on"][1] * dx)), rel=1e-4)


def test_cpu_fusion_policy_auto_follows_the_backend_and_bad_values_are_named(fusion_policy):
  assert cpu_fusion.installed() == "auto"
  assert cpu_fusion.enabled() == (jax.default_backend() == "cpu")
  fusion_policy("off")
  assert not cpu_fusion.enabled()
  with pytest.raises(ValueError, match=r"cpu_fusion policy='fast' is invalid; choose one of "
                                       r"\('auto', 'on', 'off'\)"):
    cpu_fusion.install("fast")
  assert cpu_fusion.installed() == "off"  # a rejected value leaves the policy as it was


def test_a_layer_that_bypasses_the_residual_method_fails_instead_of_losing_the_boundary(
    fusion_policy):
  """Renaming the method the layer routes its sublayers through (here: a subclass whose `sublayer`
  hands off to a renamed copy, so the interceptor's method never runs) raises BoundaryMissed when
  the boundary is on, rather than silently tracing without it; 'off' traces as before."""

  class RenamedSublayer(TransformerLayer):
    def residual_branch(self, name, x_BxLxD, fn):
      return TransformerLayer.sublayer.__wrapped__(self, name, x_BxLxD, fn)

  setattr(RenamedSublayer, cpu_fusion.RESIDUAL_METHOD, RenamedSublayer.residual_branch)
  cfg = tiny_config()
  x = jnp.asarray(rand((2, 5, 16), seed=50))
  layer = RenamedSublayer(cfg, causal=True)
  params = random_params(layer, x, seed=51)
  loss = lambda: cpu_fusion.applied(lambda p: jnp.sum(layer.apply({"params": p}, x)))
  fusion_policy("on")
  with pytest.raises(cpu_fusion.BoundaryMissed, match="TransformerLayer.sublayer"):
    jax.eval_shape(jax.grad(loss()), params)
  fusion_policy("off")  # traces (no compile needed to show it): same tree as the params
  grads = jax.eval_shape(jax.grad(loss()), params)
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)


def test_the_residual_method_is_bound_by_attribute():
  assert cpu_fusion.RESIDUAL_METHOD == "sublayer" and callable(TransformerLayer.sublayer)
