"""tfjax/training/loop/experiment.py: experiment setup and the sharded train state."""


import flax.linen as nn
import jax
import numpy as np

from tfjax.training import tasks
from tfjax.training.loop import experiment
from tfjax.nn.models import build_model
from run_helpers import one_device_placement, tiny_config
from conftest import fast_jit



def test_state_init_draws_flax_init_params():
  """The state's params are model.init's with the params half of split(PRNGKey(seed)); on CPU the
  init program is compiled unoptimized (faster), which may change float rounding only."""
  config = tiny_config()
  config.seed = 7
  exp = experiment.prepare(config)
  state = experiment.state_layout(exp, one_device_placement(config)).init()
  args, kwargs = tasks.model_inputs(exp.dataset.train_batch(0, 1), config.task)
  params_rng = jax.random.split(jax.random.PRNGKey(7))[0]
  model = build_model(exp.model_config)
  # One compiled program, not ~100 eager ops each compiled on its own (most of the time).
  init = fast_jit(lambda rng: model.init(rng, *args, **kwargs)["params"])
  expected = nn.meta.unbox(init(params_rng))
  assert jax.tree.structure(state.params) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert int(state.step) == 0
