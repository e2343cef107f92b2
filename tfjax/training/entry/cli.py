"""How every command-line entry point ends on a user's mistake: one `error: ...` line, exit 2.

A user's mistake is a bad flag (wrong type, unknown flag or config key, a missing config file), a
bad configuration or input (the ValueError every tfjax check raises, naming the key and the fix),
or a missing file or directory. It is reported as one line on stderr,

    error: <what is wrong, with the key/value/file> (<the fix>)

and the process exits with status 2 (as argparse does for usage errors). Every check runs before
anything is written, so such a run leaves no file behind. Anything else is a bug and keeps its
traceback; TFJAX_TRACEBACK=1 shows the traceback of user errors too (for debugging tfjax itself).

Entry points: `run_absl(main)` for absl programs (replaces `app.run(main)`), `ArgumentParser`
for argparse programs, `guarded(main)` around any function, `fail(message)` to stop with one.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import os
import re
import sys
from typing import Callable, NoReturn, Optional, Sequence

USAGE_ERROR = 2  # exit status of a user's mistake (argparse's and the shells' convention)

# Exceptions that mean "the input is wrong": tfjax raises ValueError for every bad key or value;
# a path the user gave that is not there surfaces as one of the OSErrors.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def fail(message: str, status: int = USAGE_ERROR) -> NoReturn:
  """Prints `error: message` (one line) to stderr and exits with `status`."""
  print(error_line(message), file=sys.stderr)
  sys.exit(status)


def error_line(message: str) -> str:
  """`error: message` on one line (for a main that returns its status instead of exiting)."""
  return f"error: {_one_line(message)}"


def _one_line(message: str) -> str:
  return " ".join(str(message).split())


def show_tracebacks() -> bool:
  """TFJAX_TRACEBACK=1: user errors keep their traceback too (debugging tfjax itself)."""
  return os.environ.get("TFJAX_TRACEBACK", "") not in ("", "0")


def message_of(error: BaseException) -> str:
  """The user-facing text of a user error (a KeyError's str() is the repr of its message)."""
  # one error wrapping another
  if len(error.args) == 1 and isinstance(error.args[0], BaseException):
    return message_of(error.args[0])
  if isinstance(error, (KeyError, AttributeError)) and len(error.args) == 1 and isinstance(
      error.args[0], str):
    text = error.args[0]
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # a KeyError's str() again
      try:
        text = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        pass
    return text
  if isinstance(error, OSError) and error.filename is not None and error.strerror:
    return f"{error.filename}: {error.strerror}"
  return str(error) or type(error).__name__


def guarded(main: Callable) -> Callable:
  """`main` with user errors (USER_ERRORS and cli.Diverged-like errors of class UserFacing)
  reported by `fail` instead of a traceback."""
  @functools.wraps(main)
  def wrapper(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except UserFacing as e:
      if show_tracebacks():
        raise
      fail(message_of(e), e.status)
    except USER_ERRORS as e:
      if show_tracebacks():
        raise
      fail(message_of(e))
  return wrapper


class UserFacing(Exception):
  """An error whose message is the whole story for the user (e.g. a run that diverged); ends the
  program with `status` and no traceback."""
  status = 1


# ---- absl programs -----------------------------------------------------------------------------
def run_absl(main: Callable, argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main)` where a bad flag, config override or config file ends in one
  `error:` line (exit 2), and so does a USER_ERRORS exception raised by `main`."""
  from absl import app  # pylint: disable=import-outside-toplevel
  app.run(guarded(main), argv=argv, flags_parser=parse_flags)


_DEFINE_ERRORS: dict = {}  # config flag name -> the error its definition raised
_CONFIG_DEFAULTS: dict = {}  # config flag name -> its default config file (None: none)
_IMPORT_ERRORS: list = []  # an --import module that failed (reported by parse_flags)


def define_import_flag(run_dir_flag: Optional[str] = None) -> None:
  """`--import=MODULE[,...]` (tfjax/runtime/imports.py) for an absl program, and the import of
  those modules now, from sys.argv: before a config-file flag is defined (which applies the
  `--config.x=...` overrides), so a kind's keys are config keys by then. With `run_dir_flag`
  (tfjax-train's workdir), a run directory given there also has the modules its config.json
  records imported (a resume needs no --import). Idempotent; define_config_file calls it. A
  module that fails is reported by `parse_flags` as one `error:` line."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from tfjax.runtime import imports  # pylint: disable=import-outside-toplevel
  if imports.FLAG not in flags.FLAGS:
    flags.DEFINE_list(imports.FLAG, [], "Modules to import first, e.g. a kind defined outside "
                      "tfjax: a module name on PYTHONPATH or a .py file's path, comma-separated "
                      "(recorded in the run's config.json; docs/attention/README.md).")
  try:
    imports.load(imports.from_argv(sys.argv))
    run_dir = imports.flag_values(sys.argv, run_dir_flag) if run_dir_flag else []
    if run_dir:
      imports.load_recorded_in(run_dir[-1])
  except ValueError as e:
    _IMPORT_ERRORS.append(e)


def define_config_file(name: str, default: Optional[str], help_string: str, **kwargs):
  """ml_collections' DEFINE_config_file, for programs run by `run_absl`.

  Why: defining a config-file flag already applies the `--NAME.key=value` overrides found in
  sys.argv to the default config, so an unknown key raises at import time, before any parser
  runs. Such an error is kept and reported by `parse_flags` as one `error:` line. The --import
  modules are imported first (define_import_flag)."""
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  define_import_flag()
  _CONFIG_DEFAULTS[name] = default
  try:
    return config_flags.DEFINE_config_file(name, default, help_string, **kwargs)
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    _DEFINE_ERRORS[name] = e
    return None


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with flag errors as one `error:` line. Also loads every config-file
  flag's config, so a missing or failing config file is reported here, not on first use."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import metrics  # pylint: disable=import-outside-toplevel
  metrics.setup_logging()
  if any(a in ("--help", "-h", "--helpshort", "-?") for a in argv[1:]):
    print_help(argv[0])
    sys.exit(0)
  for error in _IMPORT_ERRORS:  # a config naming the module's kind would fail next: say why
    fail(message_of(error))
  for error in _DEFINE_ERRORS.values():
    fail(_override_message(argv, error))
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    text = str(e)
    if "Traceback (most recent call last)" in text:  # a config file's get_config raised
      flag_part = text.split(":", 1)[0]
      fail(f"{flag_part.replace('flag ', '')}: the config file failed: "
           f"{text.strip().splitlines()[-1].strip()}")
    if isinstance(e, flags.UnrecognizedFlagError):
      text += _config_key_hint(e.flagname, e.flagvalue)
    fail(f"{_one_line(text)} (see --helpfull for each flag's type)")
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    # ml_collections' overrides (--config.a.b=v) raise these for unknown keys / wrong types.
    fail(_override_message(argv, e))
  for name in _config_flag_names():
    try:
      value = flags.FLAGS[name].value
      if value is not None:  # a config that failed to load raises on its first attribute read
        getattr(value, "keys", None)
    except (OSError, ValueError, KeyError, AttributeError, TypeError, SyntaxError) as e:
      fail(_config_file_message(name, flags.FLAGS[name], e))
  return rest


def print_help(program: str) -> None:
  """The program's summary, then each of its flags on one line: `--name=DEFAULT  help`. Flags of
  absl and ml_collections themselves are left to --helpfull."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  main = sys.modules.get("__main__")
  summary = ((getattr(main, "__doc__", None) or "").strip().splitlines() or [""])[0]
  print(f"usage: {os.path.basename(program)} [--flag=value ...]"
        + (f"\n{summary}" if summary else ""))
  print("flags (--helpfull: also absl's own):")
  rows = []
  for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith(("absl", "ml_collections")):
      continue
    for flag in module_flags:
      if any(r[0] == flag.name for r in rows) or "." in flag.name and any(
          flag.name.startswith(r[0] + ".") for r in rows):
        continue
      default = flag.value
      if _is_config_flag(flag):
        try:
          default = flag.config_filename
        except Exception:  # pylint: disable=broad-except  (no default config file)
          default = None
      rows.append((flag.name, "" if default in (None, "", []) else f"={default}",
                   _one_line(flag.help or "")))
  for name, default, text in sorted(rows):
    print(f"  --{name}{default}  {text}")


def _is_config_flag(flag) -> bool:
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  return isinstance(flag, config_flags.config_flags._ConfigFlag)  # pylint: disable=protected-access


def _config_flag_names() -> list[str]:
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  config_flag = config_flags.config_flags._ConfigFlag  # pylint: disable=protected-access
  return [name for name, flag in flags.FLAGS._flags().items()  # pylint: disable=protected-access
          if isinstance(flag, config_flag)]


def _config_key_hint(name: str, argument) -> str:
  """For an unknown flag `--NAME=V` that is the last part of a config key (`--num_steps=10`):
  `; did you mean --config.train.num_steps=10?`, else ''. Close spellings count too."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  keys = []
  for flag_name in _config_flag_names():
    try:
      config = flags.FLAGS[flag_name].value
    except Exception:  # pylint: disable=broad-except  (a config that fails is reported elsewhere)
      continue
    keys += [f"{flag_name}.{key}" for key in _flat_keys(config)]
  last_parts = sorted({key.rsplit(".", 1)[-1] for key in keys})
  wanted = name if name in last_parts else next(iter(difflib.get_close_matches(
      name, last_parts, n=1, cutoff=0.8)), None)
  matches = [key for key in keys if key.rsplit(".", 1)[-1] == wanted]
  if not matches:
    return ""
  argument = str(argument or "")
  value = argument.split("=", 1)[1] if "=" in argument else None
  shown = [f"--{key}" + (f"={value}" if value is not None else "") for key in matches[:3]]
  return f"; did you mean {' or '.join(shown)}?"


def _flat_keys(config, prefix: str = "") -> list[str]:
  """The dotted leaf keys of a ConfigDict (nested sections walked; anything else: none)."""
  if not hasattr(config, "items"):
    return []
  out = []
  for key, value in config.items():
    if hasattr(value, "items") and not isinstance(value, dict):  # a ConfigDict section
      out += _flat_keys(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


def _override_message(argv: Sequence[str], error: BaseException) -> str:
  """`--config.modle.x=1: unknown config key modle; did you mean "model" ...?`-style text."""
  from tfjax.runtime import imports  # pylint: disable=import-outside-toplevel
  # ml_collections' attribute access wraps the KeyError of an unknown key in an AttributeError
  # (AttributeError(KeyError("'attention_kind'"))): the KeyError is the error.
  while len(error.args) == 1 and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = _one_line(message_of(error))
  # A locked ConfigDict (a config file setting a key its config lacks) says it this way.
  locked = re.match(r'Key "([\w-]+)" does not exist and cannot be added', text)
  key = locked or re.match(r"'?([\w-]+)'?", text)
  culprit = next((a for a in argv[1:] if a.startswith("--") and "." in a.split("=")[0] and key
                  and key.group(1) in a.split("=")[0].split(".")), None)
  if locked or isinstance(error, KeyError) or "Did you mean" in text:
    name = _dotted_key(culprit, key.group(1))
    if "Did you mean" in text:
      detail = f"unknown config key {name}; did you mean{text.split('Did you mean', 1)[1]}"
    else:
      detail = (f"unknown config key {name} ({imports.UNKNOWN_KEY_HINT})"
                + (_section_keys(argv, culprit, key.group(1))
                   or "; read the config file for its keys"))
  else:
    detail = f"{type(error).__name__}: {text}"
  return f"{culprit}: {detail}" if culprit else detail


def _dotted_key(culprit: Optional[str], key: str) -> str:
  """`model.sigmoid_bias` for key 'sigmoid_bias' of `--config.model.sigmoid_bias=1`: the config
  path down to the unknown key (the key alone without an override naming it)."""
  if not culprit:
    return key
  parts = culprit[2:].split("=", 1)[0].split(".")[1:]
  return ".".join(parts[:parts.index(key) + 1]) if key in parts else key


def _section_keys(argv: Sequence[str], culprit: Optional[str], key: str) -> str:
  """`; model has keys a, b, ...` for the section an unknown override key was looked up in:
  the config file (the flag's value in argv, else its default) is loaded again without the
  overrides. '' when that cannot be done."""
  if not culprit:
    return ""
  flag_name, *parts = culprit[2:].split("=", 1)[0].split(".")
  if key not in parts:
    return ""
  path = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith(f"--{flag_name}=")),
              _CONFIG_DEFAULTS.get(flag_name))
  if not path:
    return ""
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  try:
    section = config_flags.config_flags.ConfigFileFlagParser(  # pylint: disable=protected-access
        flag_name, lock_config=False).parse(path)
    for part in parts[:parts.index(key)]:
      section = section[part]
    keys = sorted(str(k) for k in section.keys())
  except Exception:  # pylint: disable=broad-except  (only a hint)
    return ""
  where = ".".join([flag_name] + parts[:parts.index(key)])
  if len(keys) > 30:  # a list too long to read in one line
    return f"; no key of {where} ({len(keys)} keys) is close: read the config file for them"
  return f"; {where} has keys {', '.join(keys)}"


def _config_file_message(name: str, flag, error: BaseException) -> str:
  filename = flag.config_filename
  cause = error
  while cause.__cause__ is not None or cause.__context__ is not None:
    cause = cause.__cause__ or cause.__context__
  path = filename.split(":")[0]
  if isinstance(cause, FileNotFoundError) or not os.path.exists(path):
    return (f"--{name}={filename}: no such config file {path!r} (give a path to a configs/NAME.py "
            "file, optionally with :ARG)")
  return f"--{name}={filename}: the config file failed to load: {_one_line(message_of(cause))}"


# ---- argparse programs -------------------------------------------------------------------------
class ArgumentParser(argparse.ArgumentParser):
  """argparse with its usage errors as one `error: ... (see --help)` line, exit 2."""

  def __init__(self, *args, **kwargs):
    # Each flag on one line of --help (argparse wraps at the terminal width otherwise).
    kwargs.setdefault("formatter_class", lambda prog: argparse.HelpFormatter(
        prog, max_help_position=60, width=100_000))
    super().__init__(*args, **kwargs)

  def error(self, message: str) -> NoReturn:
    fail(f"{message} (see {self.prog} --help)")


def add_import_argument(parser: argparse.ArgumentParser) -> None:
  """`--import=MODULE[,...]` (repeatable) of an argparse program, read as `args.imports`; the
  program imports them with tfjax.runtime.imports.load before anything else."""
  parser.add_argument(
      "--import", dest="imports", action="append", default=[], metavar="MODULE[,...]",
      help="modules to import first, e.g. a kind defined outside tfjax: a module name on "
           "PYTHONPATH or a .py file's path (a run's config.json records its own)")
