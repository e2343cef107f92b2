"""Compile a config's step for TPUs or GPUs that are not attached, and say whether it fits.

`python -m tfjax.aot --config=configs/NAME.py --target=TARGET`; see tfjax/aot/main.py.
"""
from tfjax.aot.main import run

run()
