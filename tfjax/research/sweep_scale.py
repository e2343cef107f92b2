"""The scale every ablation section was run at, from its configs and committed points: model
parameters, training steps and tokens per run, seeds per arm (docs/ablations.md's `scale` block,
tfjax/research/sweep_doc.py). What a verdict at this scale can and cannot show is stated beside
the numbers, computed from them."""

from __future__ import annotations

from tfjax.research import sweep as sweep_lib

# Tiny Shakespeare's character vocabulary (the char tokenizer of its input.txt): the data is not
# committed, so the count is; tests/research/test_sweep_scale.py checks it against the rows'
# recorded params/total and, where the file is present, against the tokenizer.
CHAR_VOCAB = 65
_COUNTED: dict = {}  # model settings -> parameter count (a pure function: kept across pages)


def _vocab(config) -> int:
  if config.model.vocab_size:
    return int(config.model.vocab_size)
  if config.data.name == "tinyshakespeare":
    return CHAR_VOCAB
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  return int(datasets.make_dataset(config.data, config.task).vocab_size)


def _row_tokens(config) -> int:
  """Tokens in one training row: the char LM's seq_len, a synthetic task's padded row."""
  if config.data.name == "tinyshakespeare":
    return int(config.data.seq_len)
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  length = datasets.make_dataset(config.data, config.task).seq_len
  return int(sum(length) if isinstance(length, (tuple, list)) else length)


def section_scale(section: dict) -> dict:
  """{'params': (lo, hi), 'steps': (lo, hi), 'tokens': (lo, hi), 'seeds': (lo, hi), 'arms': n}
  over the arms of a section's committed rows (None without rows)."""
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from tfjax.training.accounting import params  # pylint: disable=import-outside-toplevel
  module, scale, rows = section["module"], section["scale"], section["rows"]
  if not rows:
    return None
  base = module.get_config(scale)
  arms: dict = {}
  for row in rows:
    arm = {k: v for k, v in row["overrides"].items() if k not in sweep_lib.SEED_KEYS}
    arms.setdefault(repr(sorted(arm.items())), [arm, 0])[1] += 1
  recorded = {repr(sorted({k: v for k, v in r["overrides"].items()
                            if k not in sweep_lib.SEED_KEYS}.items())): r["metrics"]["params/total"]
              for r in rows if "params/total" in r["metrics"]}
  counted = _COUNTED  # arms that differ only in training share a count
  sizes, steps, tokens = [], [], []
  for key, (arm, _) in arms.items():
    config = sweep_lib.apply_overrides(base, arm)
    model = dict(config.model)
    model["vocab_size"] = _vocab(config)
    settings = repr(sorted(model.items()))
    if key in recorded:  # what the point itself recorded
      sizes.append(int(recorded[key]))
    else:
      if settings not in counted:
        counted[settings] = sum(params.count_by_category(
            ModelConfig.from_config(model, platform="cpu")).values())
      sizes.append(counted[settings])
    steps.append(int(config.train.num_steps))
    tokens.append(int(config.train.num_steps) * int(config.train.batch_size) * _row_tokens(config))
  seeds = [n for _, n in arms.values()]
  span = lambda v: (min(v), max(v))  # noqa: E731
  return {"params": span(sizes), "steps": span(steps), "tokens": span(tokens),
          "seeds": span(seeds), "arms": len(arms)}


def _fmt(span, unit="") -> str:
  lo, hi = span
  f = lambda v: (f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.1f}k" if v >= 1e3  # noqa: E731
                 else f"{v:g}")
  return (f(lo) if lo == hi else f"{f(lo)}-{f(hi)}") + unit


def scale_block(sections: list) -> str:
  lines = ["| section | arms | parameters per model | training steps | training tokens per run "
           "(steps x batch x row) | seeds per arm |", "|---|---|---|---|---|---|"]
  spans = []
  for section in sections:
    s = section_scale(section) if section.get("module") is not None else None
    if s is None:
      lines.append(f"| {section['name']} | - | no committed results | - | - | - |")
      continue
    spans.append(s)
    init_only = s["steps"] == (1, 1)
    lines.append(f"| {section['name']} ({section['scale']}) | {s['arms']} | {_fmt(s['params'])} "
                 f"| {'1 (init only: no training is measured)' if init_only else _fmt(s['steps'])}"
                 f" | {'-' if init_only else _fmt(s['tokens'])} | {_fmt(s['seeds'])} |")
  if not spans:
    return "\n".join(lines)
  trained = [s for s in spans if s["steps"] != (1, 1)]  # init-only sections train nothing
  top_params = max(s["params"][1] for s in trained)
  top_tokens = max(s["tokens"][1] for s in trained)
  lines += ["", f"**What this scale can and cannot show.** Every trained model here has at most "
            f"{_fmt((top_params, top_params))} parameters and trains on at most "
            f"{_fmt((top_tokens, top_tokens))} tokens (characters or task symbols): "
            f"{65e6 / top_params:.0f} times below the smallest model the papers compare "
            "(Vaswani et al.'s base, 65M parameters, table 3) and far below their training "
            "data. A verdict here says whether the published effect appears in small models "
            "trained briefly at the stated setting, on the stated seeds: it can show that an "
            "effect exists at this scale, or that it is absent or reversed here; it cannot show "
            "that the effect holds, fails or keeps its size at the papers' scale, where "
            "optimization (warmup, init, steps) and capacity differ. The robustness column "
            "(leave-one-out, other metric) separates claims that one seed decides from those "
            "that no single seed moves; the pre-registered confirmation below says which "
            "exploratory verdicts held on fresh seeds."]
  return "\n".join(lines)
