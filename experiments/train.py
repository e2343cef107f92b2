"""Train a tfjax model: python experiments/train.py --config=configs/NAME.py --workdir=DIR."""
import signal
import sys


def _stopped_while_importing(signum, frame):
  """SIGTERM / SIGINT while Python imports tfjax and JAX: nothing is written yet, so one line
  and exit 128 + N (tfjax.training.main.run installs the handler of the later phases)."""
  del frame
  print(f"stopped by {signal.Signals(signum).name} before the first step; nothing was written",
        file=sys.stderr, flush=True)
  sys.exit(128 + signum)


if __name__ == "__main__":
  for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, _stopped_while_importing)
  from tfjax.training.main import run  # pylint: disable=g-import-not-at-top
  run()
