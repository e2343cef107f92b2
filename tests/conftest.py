"""Shared tiny helpers for the model-library tests (no reference implementations live here)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.config import ModelConfig

# Small enough that eager init/apply take milliseconds; init_std large enough that every
# weight visibly moves the outputs (the default 0.02 makes many differences tiny).
TINY = dict(vocab_size=31, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=16,
            init_std=0.3)


def tiny_config(**overrides) -> ModelConfig:
  """A validated ModelConfig at test size; any field can be overridden."""
  return ModelConfig(**{**TINY, **overrides}).validated()


def unboxed(tree):
  """Plain arrays from a (possibly nn.with_logical_partitioning-boxed) variable tree."""
  return nn.meta.unbox(tree)


def to_numpy(tree):
  """float64 NumPy copy of an (unboxed) tree, for feeding weights into NumPy references."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), unboxed(tree))


def randomize(params, seed: int = 0, scale: float = 0.5):
  """Same tree, every leaf replaced by N(0, scale^2): biases/scales stop being 0/1, so a
  reference that forgets one of them disagrees."""
  leaves, treedef = jax.tree_util.tree_flatten(unboxed(params))
  rng = np.random.default_rng(seed)
  new = [jnp.asarray(rng.normal(size=l.shape) * scale, l.dtype) for l in leaves]
  return jax.tree_util.tree_unflatten(treedef, new)


def tokens(shape, seed: int = 0, vocab: int = TINY["vocab_size"], low: int = 1):
  """Random int32 tokens in [low, vocab)."""
  return jnp.asarray(np.random.default_rng(seed).integers(low, vocab, size=shape), jnp.int32)
