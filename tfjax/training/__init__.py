"""The training loop and what it is built from, one concern per subpackage:

  loop/           the loop (train.py) and its setup (experiment.py), the step math (steps.py),
                  its hooks (hooks.py), when it acts (cadence.py), divergence (divergence.py),
                  its output (metrics.py), and K seeds as one program (packed.py)
  checkpointing/  checkpoints and their manifests, run directories read back (runs.py),
                  `config.init_from` (init_from.py), pytree leaf names (trees.py)
  config/         the base config and the default run (defaults.py), a run's config.json read
                  back and its validated ModelConfig (run_config.py)
  parallel/       the device mesh and sharding rules (sharding.py), the per-device memory plan
                  (memory_plan.py), the XLA:CPU workarounds (cpu_fusion.py)
  optim/          optimizer and schedules (optimizer.py), losses (losses.py)
  accounting/     parameter counts (params.py), FLOPs and MFU peaks (flops.py)
  entry/          the command lines: tfjax-train (main.py), tfjax-generate (generate_main.py),
                  tfjax-params (params_main.py), and their `error:` line convention (cli.py)
  tasks/          training tasks as registered plugins

The flat spellings these modules had (`tfjax.training.checkpoint`, `from tfjax.training import
sharding`, `python -m tfjax.training.main`) keep working through `ALIASES`: each is the SAME module
object as its new spelling (tfjax/runtime/module_aliases.py). `MOVED` maps names of modules that
went to the data, runtime and inference wings to their modules: importing one under
tfjax.training fails with an ImportError that names the module to import instead.
"""

from tfjax.runtime import module_aliases as _module_aliases

SUBPACKAGES = {
    "loop": ("train", "steps", "experiment", "hooks", "cadence", "divergence", "metrics",
             "packed"),
    "checkpointing": ("checkpoint", "checkpoint_manifest", "runs", "init_from", "trees"),
    "config": ("defaults", "run_config"),
    "parallel": ("sharding", "memory_plan", "cpu_fusion"),
    "optim": ("optimizer", "losses"),
    "accounting": ("params", "flops"),
    "entry": ("main", "generate_main", "params_main", "cli"),
}
ALIASES = {name: f"{__name__}.{sub}.{name}" for sub, names in SUBPACKAGES.items()
           for name in names}

MOVED = {
    "decode": "tfjax.inference.decode", "decode_window": "tfjax.inference.decode_window",
    "sampling": "tfjax.inference.sampling", "generate": "tfjax.inference.generate",
    "hashed_rng": "tfjax.data.hashed_rng", "text_files": "tfjax.data.text_files",
    "packing": "tfjax.data.packing", "synthetic": "tfjax.data.synthetic",
    "prepared": "tfjax.data.prepared", "files": "tfjax.runtime.files",
    "workdir_lock": "tfjax.runtime.workdir_lock", "compile_cache": "tfjax.runtime.compile_cache",
    "distributed": "tfjax.runtime.distributed", "stop_signals": "tfjax.runtime.stop_signals",
    "runtime": "tfjax.runtime.workarounds", "data": "tfjax.data.datasets",
    "tokenizers": "tfjax.data.tokenizers",
}

_module_aliases.install(__name__, ALIASES, MOVED)
