"""`tfjax-train` / `python experiments/train.py`: train any config with one command.

  python experiments/train.py --config=configs/NAME.py[:arg] --workdir=DIR [--config.key=value ...]

With no flags it trains configs/default.py into a fresh workdir under runs/. Running again with the
same --workdir resumes from its latest checkpoint.
"""

import datetime
import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(_REPO, "configs", "default.py")

_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "Config file, e.g. configs/shakespeare_char.py or ...py:cpu.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, TensorBoard). Default: a fresh "
    "runs/<config>-<time>.")


def fresh_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{stamp}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from tfjax import train  # pylint: disable=g-import-not-at-top  (after flags: XLA_FLAGS etc.)
  workdir = _WORKDIR.value or fresh_workdir(flags.FLAGS["config"].config_filename)
  logging.getLogger("tfjax").info("workdir: %s", workdir)
  try:
    final = train.train_and_evaluate(_CONFIG.value, workdir)
  except ValueError as e:  # configuration and data errors: one clear line, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  summary = " ".join(f"{k}={v:.4g}" for k, v in sorted(final.items()) if k.startswith("eval/"))
  print(f"done: {workdir} {summary}")


def setup_logging() -> None:
  """tfjax's own INFO lines on stderr; other libraries' (orbax logs every file it renames) only
  from WARNING up."""
  absl_logging.set_verbosity(absl_logging.WARNING)
  logger = logging.getLogger("tfjax")
  if not logger.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


def run():
  app.run(main, flags_parser=_parse_flags)


def _parse_flags(argv):
  setup_logging()
  return flags.FLAGS(argv)


if __name__ == "__main__":
  run()
