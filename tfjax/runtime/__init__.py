"""What every entry point needs around a run, none of it model or data math: atomic files and the
cache folder (`files`), one process per workdir (`workdir_lock`), the persistent XLA cache
(`compile_cache`), multi-host start-up (`distributed`), SIGTERM / Ctrl-C handling
(`stop_signals`), the startup / runtime workarounds (`workarounds`) and the outside modules of
--import (`imports`), and the old module spellings of the packages that split into subpackages
(`module_aliases`). Imports nothing from the other tfjax packages but tfjax.nn's `one_of`
check."""
