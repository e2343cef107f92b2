"""tfjax/training/parallel/memory_plan.py: per-device bytes of a sharded training state, by hand."""

import pytest

import scaleout_config
from test_sharding import _hand_activations
from tfjax.nn.config import ModelConfig
from tfjax.training.parallel import memory_plan
from tfjax.training.accounting import params as param_accounting


def test_memory_plan_matches_hand_arithmetic():
  config = scaleout_config.get_config()
  cfg = ModelConfig.from_config(config.model)
  # pylint: disable-next=import-outside-toplevel
  from tfjax.training.optim.optimizer import make_optimizer
  optimizer, _ = make_optimizer(config.optimizer, 5, cfg.d_model)
  n = param_accounting.analytic_count(cfg)
  for mesh, rows, tensor in (((1, 1, 1), 8, 1), ((1, 4, 1), 2, 1), ((2, 1, 2), 4, 2)):
    plan = memory_plan.memory_plan(cfg, mesh, batch_size=8, seq_len=16, optimizer=optimizer)
    if tensor == 1:  # every weight has an embed axis: fsdp divides all of them
      assert plan["params"] == 4 * n // mesh[1]
      assert 2 * plan["params"] <= plan["optimizer state"] <= 2 * plan["params"] + 64
    assert plan["activations"] == _hand_activations(cfg, rows, 16, tensor), mesh
  remat = memory_plan.memory_plan(cfg.replace(remat="full"), (1, 1, 1), batch_size=8,
                                       seq_len=16)
  none = memory_plan.memory_plan(cfg, (1, 1, 1), batch_size=8, seq_len=16)
  per_layer = (none["activations"] - 2 * 16 * 8 * 16 * 4) / 2
  assert remat["activations"] == 2 * 32 * 8 * 16 * 4 + per_layer + 2 * 16 * 8 * 16 * 4


def test_a_mesh_that_does_not_divide_the_batch_is_an_error():
  cfg = ModelConfig.from_config(scaleout_config.get_config().model)
  with pytest.raises(ValueError, match=r"train.batch_size=64 .* 3 batch shards .* multiple of 3"):
    memory_plan.memory_plan(cfg, (1, 3, 1), batch_size=64, seq_len=16)
