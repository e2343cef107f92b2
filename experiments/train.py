"""Train a tfjax model: python experiments/train.py --config=configs/NAME.py --workdir=DIR."""

if __name__ == "__main__":
  # First, before tfjax and JAX import (~1-2 s): a SIGTERM / SIGINT from here on ends in one line
  # and exit 128 + N (tfjax/runtime/stop_signals.py imports only the standard library).
  from tfjax.runtime import stop_signals
  with stop_signals.exits_on_stop():
    from tfjax.training.entry.main import run  # pylint: disable=g-import-not-at-top
    run()
