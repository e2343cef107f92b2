"""The README's spellings: `python -m tfjax.params` runs tfjax.training.entry.params_main (the
command line) and `import tfjax.params` is tfjax.training.accounting.params (the accounting
library)."""
import runpy
import sys

if __name__ == "__main__":
  runpy.run_module("tfjax.training.entry.params_main", run_name="__main__", alter_sys=True)
else:
  from tfjax.training.accounting import params as _params
  sys.modules[__name__] = _params
