"""tfjax/runtime/platforms.py: on a machine without a TPU, libtpu (installed by the test extra)
prints no start-up errors, and nothing hides a real accelerator or the user's JAX_PLATFORMS."""

import importlib.util
import os
import subprocess
import sys

import pytest

from run_helpers import REPO
from tfjax.runtime import platforms

# The lines libtpu prints when JAX starts it on a machine without a TPU.
LIBTPU_NOISE = ("libtpu", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "host bounds",
                "InitGoogle")
needs_cpu_host_with_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or bool(platforms.accelerator_hints()),
    reason="needs libtpu installed on a machine without a TPU or GPU")


def _stderr_of(code: str) -> str:
  env = {k: v for k, v in os.environ.items()
         if k != platforms.PLATFORMS_ENV and k not in platforms.TPU_ENV}
  # libtpu stays silent when another process holds its lock; this makes it start every time.
  env.update(PYTHONPATH=REPO, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=True)
  assert result.stdout.strip() == "cpu", result.stdout
  return result.stderr


@needs_cpu_host_with_libtpu
def test_a_plain_cpu_run_prints_no_libtpu_lines():
  # What every entry point does first (experiments/*.py, tfjax-* import tfjax) and then a
  # computation, so that JAX starts its backends.
  stderr = _stderr_of("import tfjax, jax, jax.numpy as jnp; jnp.ones(3).sum().block_until_ready();"
                      " print(jax.default_backend())")
  assert not [line for line in stderr.splitlines() if any(n in line for n in LIBTPU_NOISE)], stderr
  # The control: JAX alone, on the same machine, starts libtpu and prints them.
  control = _stderr_of("import jax; print(jax.default_backend())")
  assert any(n in control for n in LIBTPU_NOISE), control


def test_accelerator_hints_see_tpu_and_gpu_device_files_and_google_pci_devices(tmp_path,
                                                                               monkeypatch):
  for name in platforms.TPU_ENV:
    monkeypatch.delenv(name, raising=False)
  root = str(tmp_path)
  pci = tmp_path / "sys" / "bus" / "pci" / "devices"
  (pci / "0000:00:04.0").mkdir(parents=True)
  (pci / "0000:00:04.0" / "vendor").write_text("0x8086\n")  # an Intel device: not a hint
  (tmp_path / "dev").mkdir()
  assert platforms.accelerator_hints(root) == []
  (pci / "0000:00:05.0").mkdir()
  (pci / "0000:00:05.0" / "vendor").write_text("0x1ae0\n")  # Google's: a TPU chip (or gVNIC)
  assert platforms.accelerator_hints(root) == [str(pci / "0000:00:05.0" / "vendor")]
  (pci / "0000:00:05.0" / "vendor").write_text("0x10de\n")
  for device in ("accel0", "nvidia0"):
    (tmp_path / "dev" / device).write_text("")
    assert platforms.accelerator_hints(root) == [str(tmp_path / "dev" / device)]
    os.remove(tmp_path / "dev" / device)
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  assert platforms.accelerator_hints(root) == ["TPU_ACCELERATOR_TYPE"]


@pytest.mark.parametrize("env", [{"JAX_PLATFORMS": "tpu"}, {"JAX_PLATFORMS": ""},
                                 {"TPU_WORKER_HOSTNAMES": "10.0.0.2"}])
def test_the_users_platforms_and_a_tpu_vm_keep_jaxs_default(monkeypatch, env):
  monkeypatch.delenv(platforms.PLATFORMS_ENV, raising=False)
  for name in platforms.TPU_ENV:
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert platforms.quiet_absent_tpu() is False
  assert os.environ.get(platforms.PLATFORMS_ENV) == env.get(platforms.PLATFORMS_ENV)
