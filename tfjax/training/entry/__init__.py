"""The command lines: tfjax-train (main.py), tfjax-generate (generate_main.py), tfjax-params
(params_main.py), and how every entry point ends on a user's mistake (cli.py: one `error:` line,
exit 2)."""
