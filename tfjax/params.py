"""`python -m tfjax.params` (the README's command) runs `tfjax.training.params`, the same module."""
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("tfjax.training.params", run_name="__main__", alter_sys=True)
else:
  from tfjax.training import params as _params
  sys.modules[__name__] = _params
