"""The training loop: train.py loops over steps.py's jitted math, set up by experiment.py, acting
through hooks.py at cadence.py's steps, stopping on divergence.py's non-finite values, writing
metrics.py's output; packed.py trains K seeds of one config as one program."""
