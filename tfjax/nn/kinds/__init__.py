"""The built-in attention kinds beside softmax, one module each (tfjax/nn/attention_kinds.py).

Importing this package imports every module in it, and each registers its kind at import: a new
built-in kind is one new file here. tfjax/nn/config.py imports the package, so every kind is
registered (and its config keys are config.model keys) before a config is built. A kind module
may import tfjax.nn.attention and the blocks, not tfjax.nn.config (which imports this package).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")
