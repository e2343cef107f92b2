"""Default run: a 2-layer decoder learns to reverse sequences (synthetic, no network, no files).

Trains on lengths 1..16 and evaluates exact match at 8 and 16 (in distribution) and at 24 and 32
(length generalization: RoPE positions past the training lengths were never trained, so these
stay near 0). Small and synthetic, so that `python experiments/train.py` with no flags trains it
on any CPU and shows the whole system working.
"""
# The default run lives in the package (tfjax.training.config.defaults.get_config) so that an
# installed `tfjax-train` finds it; this file is the same config under its usual name.
from tfjax.training.config.defaults import get_config  # noqa: F401  pylint: disable=unused-import
