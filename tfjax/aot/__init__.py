"""Ahead-of-time compilation for hardware that is not attached: `python -m tfjax.aot`.

  targets.py   target names, their devices' peaks (with sources) and XLA GPU target configs
  devices.py   compile-only devices of a target (libtpu / the CUDA plugin, no hardware)
  program.py   the train / eval / decode step of a config, traced for those devices
  hlo.py       collectives and kernel calls in the optimized HLO, loop trip counts applied
  tpu_vmem.py  a Mosaic kernel's scoped VMEM, bisected from libtpu's refusals to compile it
  roofline.py  analytic FLOPs and minimum collectives; the roofline step time and MFU bound
  report.py    the table, the verdict and the JSON line
  main.py      the command line
"""
