"""tfjax/runtime/compile_cache.py: the persistent XLA compilation cache."""

import logging
import os

import jax

from run_helpers import run_cli, train_losses



def test_cli_loads_compiled_programs_from_the_persistent_cache(tmp_path):
  """A second run of the same config loads its programs from the cache (JAX logs the hit) and
  trains to the same losses; --compilation_cache=none writes no cache."""
  # One test length (the default config evaluates four, each its own program): three runs that
  # each compile three eval programs fewer.
  args = ["--config.train.num_steps=3", "--config.train.log_every=1", "--config.train.eval_every=3",
          "--config.model.num_layers=1", "--config.model.d_model=32",
          "--config.data.test_lengths=(8,)", f"--compilation_cache={tmp_path / 'xla'}"]
  first = run_cli([f"--workdir={tmp_path / 'a'}", *args], cwd=tmp_path)
  assert first.returncode == 0, first.stderr[-2000:]
  assert any(name.startswith("jit_train_step-") for name in os.listdir(tmp_path / "xla"))
  second = run_cli([f"--workdir={tmp_path / 'b'}", *args], cwd=tmp_path, JAX_LOG_COMPILES="1")
  assert second.returncode == 0, second.stderr[-2000:]
  assert "Persistent compilation cache hit for 'jit_train_step'" in second.stderr, (
      second.stderr[-3000:])
  assert train_losses(str(tmp_path / "a")) == train_losses(str(tmp_path / "b"))
  off = run_cli([f"--workdir={tmp_path / 'c'}", *args[:-1], "--compilation_cache=none"],
                 cwd=tmp_path)
  assert off.returncode == 0, off.stderr[-2000:]
  assert not (tmp_path / "cache").exists()  # 'none' does not fall back to the default either


def test_unusable_compilation_cache_directory_warns_and_leaves_jax_alone(tmp_path, caplog):
  from tfjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  before = jax.config.jax_compilation_cache_dir
  with caplog.at_level(logging.WARNING):
    assert compile_cache.enable(str(blocker / "xla")) is None
  assert "compilation cache disabled" in caplog.text and str(blocker) in caplog.text
  assert compile_cache.enable("none") is None
  assert jax.config.jax_compilation_cache_dir == before
