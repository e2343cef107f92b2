"""tfjax: Transformer architectures in JAX/Flax."""
from tfjax.runtime import platforms as _platforms

__version__ = "0.1.0"
# No TPU here but libtpu installed: CPU only, without libtpu's start-up errors (once, at import).
_platforms.quiet_absent_tpu()
