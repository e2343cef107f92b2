"""Shared tiny helpers for the model-library tests (no reference implementations live here)."""

import importlib.metadata
import os
import sys

# tests/ mirrors the package's folders; the shared helpers (np_reference, run_helpers, ...) live
# at its root, importable from every folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# With libtpu installed (tests/aot/test_aot.py compiles for TPU), every process that starts JAX loads
# it, and by default only one process per host may: let test workers and subprocesses share it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Tests compare values, not speed: on a CPU-only machine every program (here and in the child
# processes, which inherit the environment) compiles without LLVM's optimizations and with
# XLA:CPU's older fusion emitters; each about halves compile time, most of the suite's. The flag
# is known to jaxlib 0.10 (XLA stops a process on a flag it does not know).
from tfjax.runtime import platforms  # pylint: disable=wrong-import-position
if not platforms.accelerator_hints():
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  _FLAGS = os.environ.get("XLA_FLAGS", "")
  if importlib.metadata.version("jaxlib").startswith("0.10.") and "fusion_emitters" not in _FLAGS:
    os.environ["XLA_FLAGS"] = f"{_FLAGS} --xla_cpu_use_fusion_emitters=false".strip()

import flax.linen as nn  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(scope="module")
def fast_compiles():
  """Tiny models: XLA's optimization passes cost far more than they save. What the environment
  above does on a CPU-only machine, for a module's tests on any machine
  (`pytestmark = pytest.mark.usefixtures("fast_compiles")`)."""
  name = "jax_disable_most_optimizations"
  try:
    previous = jax.config.read(name)
    jax.config.update(name, True)
  except (AttributeError, KeyError):  # only a speed-up: run optimized where the flag is gone
    previous = None
  yield
  if previous is not None:
    jax.config.update(name, previous)


from tfjax.nn.config import ModelConfig
from tfjax.training.parallel import cpu_fusion

# Small enough that eager init/apply take milliseconds; init_std large enough that every
# weight visibly moves the outputs (the default 0.02 makes many differences tiny).
TINY = dict(vocab_size=31, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=16,
            init_std=0.3)


def tiny_config(**overrides) -> ModelConfig:
  """A validated ModelConfig at test size; any field can be overridden."""
  return ModelConfig.from_flat({**TINY, **overrides}).validated()


def assert_owner_rejects(section: str, overrides: dict, patterns) -> None:
  """The config section `section` (ModelConfig.<section>) rejects `overrides` (flat model.* keys)
  by itself, with a message holding every pattern (the flat key, the value, the choices); and so
  does every way of building a config."""
  model = ModelConfig.from_flat({**TINY, **overrides})  # not validated yet
  with pytest.raises(ValueError) as info:
    getattr(model, section).validate(model)
  for pattern in patterns:
    assert pattern in str(info.value), (pattern, str(info.value))
  with pytest.raises(ValueError):
    tiny_config(**overrides)
  with pytest.raises(ValueError):
    tiny_config().replace(**overrides)


def unboxed(tree):
  """Plain arrays from a (possibly nn.with_logical_partitioning-boxed) variable tree."""
  return nn.meta.unbox(tree)


def to_numpy(tree):
  """float64 NumPy copy of an (unboxed) tree, for feeding weights into NumPy references."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), unboxed(tree))


def randomize(params, seed: int = 0, scale: float = 0.5):
  """Same tree (arrays or ShapeDtypeStructs), every leaf drawn afresh: norm scales 1 + N(0, s^2),
  everything else N(0, s^2). Biases stop being 0, so a reference that forgets one disagrees."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(unboxed(params))
  rng = np.random.default_rng(seed)
  new = []
  for path, leaf in flat:
    value = rng.normal(size=leaf.shape) * scale
    if jax.tree_util.keystr(path).endswith("['scale']"):
      value = value + 1.0
    new.append(jnp.asarray(value, leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, new)


def random_params(module, *args, seed: int = 0, scale: float = 0.3, **kwargs):
  """Random parameters with the module's own tree, without running (and compiling) its
  initializers: shapes come from jax.eval_shape, values from NumPy."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args, **kwargs))
  return randomize(shapes["params"], seed=seed, scale=scale)


def tokens(shape, seed: int = 0, vocab: int = TINY["vocab_size"], low: int = 1):
  """Random int32 tokens in [low, vocab)."""
  return jnp.asarray(np.random.default_rng(seed).integers(low, vocab, size=shape), jnp.int32)


# Tests compare values, not speed: on CPU skip LLVM's optimizations, which halves compile time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def fast_jit(fn):
  """jax.jit(fn), compiled with FAST_COMPILE on CPU (positional arguments only)."""
  jitted = jax.jit(fn)
  if jax.default_backend() != "cpu":
    return jitted
  compiled = {}  # one program per argument structure, shapes and dtypes, as jax.jit keeps

  def call(*args):
    key = str(jax.tree.map(lambda a: (np.shape(a), str(getattr(a, "dtype", type(a)))), args))
    if key not in compiled:
      compiled[key] = jitted.lower(*args).compile(FAST_COMPILE)
    return compiled[key](*args)

  return call



@pytest.fixture(autouse=True, scope="session")
def compilation_cache_shared_by_the_workers(tmp_path_factory):
  """JAX's persistent compilation cache in this session's tmp folder, shared by the xdist workers.
  Why: many tests train the same tiny configs, and each train_and_evaluate compiles its programs
  afresh (new closures); a hit loads the same executable (values unchanged) instead of compiling
  again, which was most of those tests' time."""
  from tfjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel
  base = tmp_path_factory.getbasetemp()  # with xdist: <session tmp>/popen-gwN
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  previous = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs,
              jax.config.jax_persistent_cache_min_entry_size_bytes)
  yield compile_cache.enable(str(root / "xla-cache"))
  jax.config.update("jax_compilation_cache_dir", previous[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", previous[1])
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", previous[2])


@pytest.fixture
def full_precision_matmuls():
  """Float32 matmuls at full precision (GPUs default to TF32, ~1e-3 off the NumPy references).
  A no-op on CPU. Modules comparing against NumPy use it via `pytestmark`."""
  with jax.default_matmul_precision("float32"):
    yield


@pytest.fixture
def fusion_policy():
  """Sets tfjax.training.parallel.cpu_fusion's policy for one test, then restores the default."""
  yield cpu_fusion.install
  cpu_fusion.install("auto")


@pytest.fixture(autouse=True, scope="session")
def cache_dir_under_tmp(tmp_path_factory):
  """$TFJAX_CACHE_DIR (downloads, the XLA compilation cache) points into this session's tmp
  folder, for the tests and the subprocesses they start: a test never writes under ~/.cache."""
  from tfjax.runtime import files  # pylint: disable=import-outside-toplevel
  previous = os.environ.get(files.CACHE_DIR_ENV)
  os.environ[files.CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("tfjax-cache"))
  yield os.environ[files.CACHE_DIR_ENV]
  if previous is None:
    os.environ.pop(files.CACHE_DIR_ENV, None)
  else:
    os.environ[files.CACHE_DIR_ENV] = previous
