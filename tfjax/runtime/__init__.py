"""What every entry point needs around a run, none of it model or data math: atomic files and the
cache folder (`files`), one process per workdir (`workdir_lock`), the persistent XLA cache
(`compile_cache`), multi-host start-up (`distributed`), SIGTERM / Ctrl-C handling
(`stop_signals`) and the startup / runtime workarounds (`workarounds`). Imports nothing from the
other tfjax packages but tfjax.nn's `one_of` check."""
