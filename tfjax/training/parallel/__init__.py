"""Devices: the mesh and logical-axis sharding rules (sharding.py), what one device holds on a mesh
(memory_plan.py), and the XLA:CPU workarounds kept out of the model blocks (cpu_fusion.py)."""
