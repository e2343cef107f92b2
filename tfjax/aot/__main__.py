"""`python -m tfjax.aot`: see tfjax/aot/main.py."""
from tfjax.aot.main import run

run()
