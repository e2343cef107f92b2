"""Configuration: the base config every configs/*.py starts from and the default run
(defaults.py), and a run's config.json read back with its validated ModelConfig (run_config.py)."""
