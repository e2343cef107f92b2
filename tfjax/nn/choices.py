"""`one_of`: the one "choose one of" check behind every config value with a fixed set of choices.

A leaf with no imports but the standard library, so jax-free modules (synthetic tasks,
tokenizers) use it as well as the model config (tfjax/nn/config.py re-exports it).
"""

import difflib


def one_of(what: str, value, valid, *, registered: str = ""):
  """`value` if it is one of `valid`, else a ValueError naming `what`, the value and the choices,
  with the closest choice when one is close (a misspelling): `one_of("model.ffn", cfg.ffn, FFNS)`.
  registered: for a registry's names (`"an attention kind"`), what the value names; with no close
  choice the error then says how one defined outside tfjax becomes known (`import_hint`).
  """
  if value not in valid:
    close = did_you_mean(value, valid)
    hint = f" ({import_hint(registered)})" if registered and not close else ""
    raise ValueError(f"{what}={value!r} is invalid; choose one of {tuple(valid)}{close}{hint}")
  return value


def import_hint(what: str) -> str:
  """How `what` (an attention kind, a key of one) defined outside tfjax becomes known: its module
  imported by --import (tfjax/runtime/imports.py)."""
  return f"{what} defined outside tfjax is known once its module is imported: --import=MODULE"


def did_you_mean(value, valid) -> str:
  """`; did you mean 'performer'?` when a string `value` is a close spelling of one of `valid`
  (difflib's ratio >= 0.6), else ''."""
  if not isinstance(value, str):
    return ""
  close = difflib.get_close_matches(value, [v for v in valid if isinstance(v, str)], n=1)
  return f"; did you mean {close[0]!r}?" if close else ""
