"""tfjax/training/checkpointing/trees.py: one name per pytree leaf, whatever the container."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.training.checkpointing.trees import path_names


@dataclasses.dataclass
class _State:
  step: int
  params: dict


jax.tree_util.register_dataclass(_State, data_fields=["step", "params"], meta_fields=[])


def _names(tree, **kwargs):
  return [path_names(path, **kwargs) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_dict_keys_attributes_and_indices_are_named_alike():
  state = _State(step=jnp.int32(0), params={"dense": {"kernel": jnp.ones(2)}, "stack": [1.0, 2.0]})
  assert _names(state) == [("step",), ("params", "dense", "kernel"), ("params", "stack", "0"),
                           ("params", "stack", "1")]


def test_dict_keys_only_drops_the_box_value_of_logically_partitioned_params():
  boxed = {"attn": {"kernel": nn.LogicallyPartitioned(jnp.ones((2, 2)), ("embed", "heads"))}}
  assert _names(boxed) == [("attn", "kernel", "value")]
  assert _names(boxed, dict_keys_only=True) == [("attn", "kernel")]
