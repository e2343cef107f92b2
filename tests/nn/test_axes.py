"""tfjax/nn/axes.py: the logical axis names are the ones the sharding rules map."""

from tfjax.nn import axes
from tfjax.training.parallel import sharding
from tfjax.training.config.defaults import base_config


def test_every_logical_axis_has_a_sharding_rule_and_names_are_distinct():
  names = [axes.BATCH, axes.LENGTH, axes.EMBED, axes.HEADS, axes.KV_HEADS, axes.HEAD_DIM,
           axes.MLP, axes.VOCAB, axes.LAYERS]
  assert len(set(names)) == len(names)
  ruled = {name for name, _ in sharding.rules(base_config())}
  assert set(names) <= ruled, set(names) - ruled
  assert axes.RESIDUAL_STREAM == (axes.BATCH, axes.LENGTH, axes.EMBED)
