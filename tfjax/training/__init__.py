"""The training loop and what it is built from (experiment setup, steps, optimizer, checkpoints,
metrics, sharding, accounting). `MOVED` maps tfjax.training names of modules that belong to the
data, runtime and inference wings to their modules: importing one under tfjax.training fails with
an ImportError that names the module to import instead of a bare "No module named"."""

import importlib.abc
import sys

MOVED = {
    "decode": "tfjax.inference.decode", "decode_window": "tfjax.inference.decode_window",
    "sampling": "tfjax.inference.sampling", "generate": "tfjax.inference.generate",
    "hashed_rng": "tfjax.data.hashed_rng", "text_files": "tfjax.data.text_files",
    "packing": "tfjax.data.packing", "synthetic": "tfjax.data.synthetic",
    "prepared": "tfjax.data.prepared", "files": "tfjax.runtime.files",
    "workdir_lock": "tfjax.runtime.workdir_lock", "compile_cache": "tfjax.runtime.compile_cache",
    "distributed": "tfjax.runtime.distributed", "stop_signals": "tfjax.runtime.stop_signals",
    "runtime": "tfjax.runtime.workarounds", "data": "tfjax.data.datasets",
    "tokenizers": "tfjax.data.tokenizers",
}


class _MovedModules(importlib.abc.MetaPathFinder):
  """Turns `import tfjax.training.<moved>` into an ImportError that names the new module."""

  def find_spec(self, fullname, path, target=None):  # pylint: disable=unused-argument
    prefix, _, name = fullname.rpartition(".")
    if prefix == __name__ and name in MOVED:
      raise ImportError(f"{fullname} is {MOVED[name]}: import it from there")
    return None


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
  sys.meta_path.insert(0, _MovedModules())
