"""Counting a model without running it: parameters by component (params.py; `python -m
tfjax.params`), and training FLOPs per token with MFU peaks (flops.py)."""
