"""`one_of`: the one "choose one of" check behind every config value with a fixed set of choices.

A leaf with no imports, so jax-free modules (synthetic tasks, tokenizers) use it as well as the
model config (tfjax/nn/config.py re-exports it).
"""


def one_of(what: str, value, valid):
  """`value` if it is one of `valid`, else a ValueError naming `what`, the value and the choices:
  `one_of("model.ffn", cfg.ffn, FFNS)`."""
  if value not in valid:
    raise ValueError(f"{what}={value!r} is invalid; choose one of {tuple(valid)}")
  return value
