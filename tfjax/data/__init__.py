"""Corpora bigger than memory: `prepare` tokenizes them once into memory-mappable token shards
with a manifest (`tfjax-prepare`, `python -m tfjax.data.prepare`); `shards` opens and verifies a
prepared directory. Nothing here imports tfjax.training: the training system reads prepared
directories through tfjax.data.prepared."""
