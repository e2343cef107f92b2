"""The spelling configs/ablations/*.py import: the same module as tfjax.data.tokenizers."""
import sys

from tfjax.data import tokenizers as _module

sys.modules[__name__] = _module
