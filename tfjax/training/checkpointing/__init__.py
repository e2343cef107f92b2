"""What a run keeps and what another run reads back: orbax checkpoints (checkpoint.py) sealed by a
manifest (checkpoint_manifest.py), a run directory read back (runs.py), starting from another
run's params (init_from.py), and the leaf names every comparison of trees uses (trees.py)."""
