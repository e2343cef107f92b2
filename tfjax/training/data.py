"""The spelling configs/ablations/*.py import: the same module as tfjax.data.datasets."""
import sys

from tfjax.data import datasets as _module

sys.modules[__name__] = _module
