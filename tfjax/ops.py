"""`tfjax.ops` is the README's documented spelling of `tfjax.nn.ops` (kept as the same module)."""
import sys

from tfjax.nn import ops as _ops

sys.modules[__name__] = _ops
