"""Attention kinds against sequence length: time and memory of one attention layer's fwd+bwd.

For every registered `model.attention_kind` (tfjax.nn.attention_kinds.ATTENTION_KINDS, so kinds
added later are measured without editing this file; softmax twice, as model.attention_impl 'xla'
= full attention that materializes the L x L scores, and 'chunked' = flash-style blockwise
attention in plain JAX), one bidirectional MultiHeadAttention (batch 1, float32, d_model
--d_model, --heads heads, the kind's default settings) is compiled for
  loss = sum(attention(x)), grads w.r.t. the parameters and x
at each L of --lengths, and timed (median of repeats; fewer repeats at long L). Memory: the
compiled executable's XLA memory analysis, temporaries + arguments (what the program holds at
its peak besides its outputs; not the process's RSS, which on CPU also holds the runtime).
A point whose compiled memory exceeds --mem_cap_gib is skipped (not run) with the reason; so is a
kind whose config rejects the length (e.g. a projection longer than L), with its error.

Per kind, the log-log slope of time and of memory against L is fitted over the points of
L >= --fit_from (least squares of log y on log L): about 1 for O(L), about 2 for O(L^2).

Per kind, its crossover length against softmax ('xla' and 'chunked'), for time and for memory:
the L from which the kind is at most softmax's cost at every larger measured L, interpolated
log-log between the two bracketing measured lengths (log y is taken as linear in log L between
them); "below" the smallest measured length when the kind is cheaper at every measured L, "not
within" the measured range when it is dearer at the largest. Memory uses every compiled point
(a point skipped over --mem_cap_gib still has its compiled memory), time the points that ran.

  python experiments/bench_attention_kinds.py                  # 256..16k, every kind (~10 min CPU)
  python experiments/bench_attention_kinds.py --kinds=softmax --lengths=1024,2048 \\
      --out=/tmp/kinds.json --md=/tmp/kinds.md
  python experiments/bench_attention_kinds.py --md=docs/attention/efficiency.md --md_block
      (rewrites the generated block between the page's markers)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from tfjax.training.entry import cli

BLOCK_BEGIN, BLOCK_END = "<!-- attention_kinds:begin -->", "<!-- attention_kinds:end -->"
SOFTMAX_IMPLS = ("xla", "chunked")  # full (L x L scores) and flash-style blockwise


def variants(kinds=None) -> list[tuple[str, str]]:
  """[(kind, attention_impl)] of every registered kind (or of `kinds`), softmax once per impl."""
  import tfjax.nn.models  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from tfjax.nn.attention_kinds import ATTENTION_KINDS  # pylint: disable=import-outside-toplevel
  names = list(ATTENTION_KINDS) if kinds is None else list(kinds)
  unknown = [k for k in names if k not in ATTENTION_KINDS]
  if unknown:
    raise ValueError(f"--kinds={','.join(unknown)}: not registered; registered kinds: "
                     f"{', '.join(sorted(ATTENTION_KINDS))}")
  return [(k, impl) for k in names for impl in (SOFTMAX_IMPLS if k == "softmax" else ("xla",))]


def layer_config(kind: str, impl: str, seq_len: int, d_model: int, heads: int):
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  return ModelConfig.from_config(dict(
      family="encoder", attention_kind=kind, attention_impl=impl, d_model=d_model,
      num_heads=heads, d_ff=4 * d_model, num_layers=1, max_len=seq_len, position="none",
      vocab_size=16, dtype="float32", mlm_head=False), platform="cpu")


def compile_point(kind: str, impl: str, seq_len: int, d_model: int, heads: int):
  """(compiled fwd+bwd, its arguments as abstract shapes, params) of one attention layer."""
  from tfjax.nn.attention import MultiHeadAttention  # pylint: disable=import-outside-toplevel
  module = MultiHeadAttention(layer_config(kind, impl, seq_len, d_model, heads), causal=False)
  x_1xLxD = jax.ShapeDtypeStruct((1, seq_len, d_model), jnp.float32)
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
  params = jax.eval_shape(lambda x: module.init(rngs, x), x_1xLxD)

  def fwd_bwd(variables, x):
    def loss(variables, x):
      return module.apply(variables, x, rngs={"dropout": jax.random.PRNGKey(2)}).sum()
    return jax.grad(loss, argnums=(0, 1))(variables, x)

  compiled = jax.jit(fwd_bwd).lower(params, x_1xLxD).compile()
  return compiled, (params, x_1xLxD)


def memory_bytes(compiled) -> dict:
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  return dict(temp_bytes=int(analysis.temp_size_in_bytes),
              argument_bytes=int(analysis.argument_size_in_bytes),
              output_bytes=int(analysis.output_size_in_bytes),
              peak_bytes=int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes))


def time_ms(compiled, args, repeats: int) -> float:
  jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)


def repeats_at(seq_len: int, repeats: int) -> int:
  """Fewer repeats at long L (one call of full attention at 16k takes seconds on 2 CPU cores)."""
  return max(1, repeats if seq_len <= 2048 else repeats // 2 if seq_len <= 4096 else 1)


def measure(kind, impl, seq_len, cfg) -> dict:
  row = dict(kind=kind, impl=impl, seq_len=seq_len, d_model=cfg.d_model, heads=cfg.heads,
             batch=1, dtype="float32")
  try:
    compiled, shapes = compile_point(kind, impl, seq_len, cfg.d_model, cfg.heads)
  except ValueError as e:  # the kind's config rejects this length: recorded, not fatal
    return {**row, "status": f"skipped: {str(e).splitlines()[0][:200]}"}
  row.update(memory_bytes(compiled))
  cap = cfg.mem_cap_gib * 2 ** 30
  if row.get("peak_bytes", 0) > cap:
    return {**row, "status": f"skipped: compiled memory {row['peak_bytes'] / 2 ** 30:.2f} GiB "
                             f"> --mem_cap_gib={cfg.mem_cap_gib:g}"}
  keys = iter(jax.random.split(jax.random.PRNGKey(0), 1 + len(jax.tree.leaves(shapes[0]))))
  args = jax.tree.map(lambda s: 0.02 * jax.random.normal(next(keys), s.shape, s.dtype), shapes)
  row["time_ms"] = time_ms(compiled, args, repeats_at(seq_len, cfg.repeats))
  row["repeats"] = repeats_at(seq_len, cfg.repeats)
  row["status"] = "ok"
  return row


def loglog_slope(lengths, values) -> float | None:
  """Least-squares slope of log(value) on log(length); None with fewer than 2 points."""
  if len(lengths) < 2:
    return None
  return float(np.polyfit(np.log(lengths), np.log(values), 1)[0])


def fits(rows, fit_from: int) -> list[dict]:
  out = []
  for kind, impl in dict.fromkeys((r["kind"], r["impl"]) for r in rows):
    ok = [r for r in rows if (r["kind"], r["impl"]) == (kind, impl) and r["status"] == "ok"
          and r["seq_len"] >= fit_from]
    lengths = [r["seq_len"] for r in ok]
    out.append(dict(kind=kind, impl=impl, points=len(ok),
                    lengths=f"{min(lengths)}-{max(lengths)}" if ok else "-",
                    time_slope=loglog_slope(lengths, [r["time_ms"] for r in ok]),
                    memory_slope=loglog_slope(lengths, [r["peak_bytes"] for r in ok])))
  return out


def crossover(lengths, kind_values, ref_values) -> dict:
  """From which length a kind pays against a reference, over their common measured lengths.

  `lengths` ascending; `kind_values` / `ref_values` the kind's and the reference's cost there
  (None where not measured). Returns {'status', 'length', 'crossings', 'range'}:
    status 'crosses': the kind is dearer at some L and at most the reference's cost at every
      measured L above the last such one; 'length' is where the two meet, log-log interpolated
      between that L (L1, ratio r1 = kind / ref > 1) and the next one (L2, r2 <= 1):
      log L* = log L1 + log(r1) / (log(r1) - log(r2)) * (log L2 - log L1);
    'below': at most the reference's cost at every measured L (length None: below the smallest);
    'not_within': dearer at the largest measured L (length None);
    'no_points': fewer than one common length.
  'crossings': every length where the ratio passes 1, interpolated the same way, as
  [L*, 'cheaper above' | 'dearer above'] (a kind cheaper only at short L has one 'dearer above');
  'range': [smallest, largest] common measured length.
  """
  pts = [(n, k, r) for n, k, r in zip(lengths, kind_values, ref_values)
         if k is not None and r is not None and k > 0 and r > 0]
  if not pts:
    return dict(status="no_points", length=None, crossings=[], range=None)
  logs = [(math.log(n), math.log(k / r)) for n, k, r in pts]  # log ratio; <= 0: the kind pays

  def meet(i):  # where log ratio, linear in log L between points i and i + 1, is 0
    (x1, d1), (x2, d2) = logs[i], logs[i + 1]
    return float(math.exp(x1 + d1 / (d1 - d2) * (x2 - x1)))

  crossings = [[meet(i), "cheaper above" if logs[i][1] > 0 else "dearer above"]
               for i in range(len(logs) - 1) if (logs[i][1] > 0) != (logs[i + 1][1] > 0)]
  dearer = [i for i, (_, d) in enumerate(logs) if d > 0]
  span = [pts[0][0], pts[-1][0]]
  if not dearer:
    return dict(status="below", length=None, crossings=crossings, range=span)
  if dearer[-1] == len(logs) - 1:
    return dict(status="not_within", length=None, crossings=crossings, range=span)
  return dict(status="crosses", length=meet(dearer[-1]), crossings=crossings, range=span)


def crossovers(rows) -> list[dict]:
  """Every non-softmax kind's crossover() against softmax 'xla' and 'chunked', time and memory."""
  def series(kind, impl, key):
    return {r["seq_len"]: r.get(key) for r in rows if (r["kind"], r["impl"]) == (kind, impl)
            and (key != "time_ms" or r["status"] == "ok")}
  out = []
  pairs = dict.fromkeys((r["kind"], r["impl"]) for r in rows if r["kind"] != "softmax")
  for kind, impl in pairs:
    for ref in SOFTMAX_IMPLS:
      if not any((r["kind"], r["impl"]) == ("softmax", ref) for r in rows):
        continue
      entry = dict(kind=kind, impl=impl, against=f"softmax/{ref}")
      for metric, key in (("time", "time_ms"), ("memory", "peak_bytes")):
        mine, theirs = series(kind, impl, key), series("softmax", ref, key)
        lengths = sorted(set(mine) & set(theirs))
        entry[metric] = crossover(lengths, [mine[n] for n in lengths],
                                  [theirs[n] for n in lengths])
      out.append(entry)
  return out


def cheaper_spans(c: dict) -> list[list]:
  """The spans of L where the kind is at most the reference's cost, [start, end], from its
  crossings; start None: from below the smallest measured L, end None: to the largest and on."""
  spans, start = [], None if c["status"] in ("below",) or (
      c["crossings"] and c["crossings"][0][1] == "dearer above") else "dearer"
  for n, direction in c["crossings"]:
    if direction == "cheaper above":
      start = n
    else:
      spans.append([start, n])
      start = "dearer"
  if start != "dearer":
    spans.append([start, None])
  return spans


def describe_crossover(c: dict) -> str:
  """One table cell: 'from ≈ 1,450', '< 256 (cheaper at every measured L)', 'not within
  256-16384 (dearer at 16384); cheaper only below ≈ 6,550' (or 'between ≈ 409 and ≈ 1,042')."""
  if c["status"] == "no_points":
    return "no common points"
  lo, hi = c["range"]
  if c["status"] == "crosses":
    text = f"from ≈ {c['length']:,.0f}"
  elif c["status"] == "below":
    text = f"< {lo} (cheaper at every measured L)"
  else:
    text = f"not within {lo}-{hi} (dearer at {hi})"
  earlier = [f"below ≈ {end:,.0f}" if start is None else f"between ≈ {start:,.0f} and ≈ {end:,.0f}"
             for start, end in cheaper_spans(c) if end is not None]
  if not earlier:
    return text
  return text + ("; also cheaper " if c["status"] == "crosses" else "; cheaper only ") + \
      ", ".join(earlier)


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def markdown(result) -> str:
  meta = result["meta"]
  lines = [f"Device {meta['device']}, JAX {meta['jax']}, {meta['date']}; command: "
           f"`{meta['command']}`. One bidirectional attention layer, batch 1, float32, d_model "
           f"{meta['d_model']}, {meta['heads']} heads; time: median ms of one jitted "
           "forward+backward; memory: the compiled program's temporaries + arguments (XLA memory "
           "analysis).", "",
           "| kind | impl | L | time ms | memory MiB | temp MiB | status |",
           "|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    mib = lambda k: None if k not in r else r[k] / 2 ** 20  # noqa: E731
    lines.append(f"| {r['kind']} | {r['impl']} | {r['seq_len']} | {_fmt(r.get('time_ms'), '.2f')}"
                 f" | {_fmt(mib('peak_bytes'), '.1f')} | {_fmt(mib('temp_bytes'), '.1f')} "
                 f"| {r['status']} |")
  lines += ["", f"Fitted log-log slopes over L >= {meta['fit_from']} (1: O(L), 2: O(L²)):", "",
            "| kind | impl | points | L | time slope | memory slope |", "|---|---|---|---|---|---|"]
  lines += [f"| {f['kind']} | {f['impl']} | {f['points']} | {f['lengths']} "
            f"| {_fmt(f['time_slope'], '.2f')} | {_fmt(f['memory_slope'], '.2f')} |"
            for f in result["fits"]]
  if result.get("crossovers"):
    lines += ["", "Crossover length against softmax: the L from which the kind costs at most "
              "softmax's at every larger measured L (log-log interpolation between the two "
              "bracketing measured lengths):", "",
              "| kind | impl | against | time | memory |", "|---|---|---|---|---|"]
    lines += [f"| {c['kind']} | {c['impl']} | {c['against']} | {describe_crossover(c['time'])} "
              f"| {describe_crossover(c['memory'])} |" for c in result["crossovers"]]
  return "\n".join(lines) + "\n"


def write_markdown(path: str, text: str, block: bool) -> None:
  """Writes `text` to `path`, or with `block` replaces the page's generated block."""
  if not block:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    return
  with open(path, encoding="utf-8") as f:
    page = f.read()
  pattern = re.compile(re.escape(BLOCK_BEGIN) + r".*?" + re.escape(BLOCK_END), re.S)
  if not pattern.search(page):
    raise ValueError(f"{path} has no block {BLOCK_BEGIN} ... {BLOCK_END}; add the two marker "
                     "lines, or drop --md_block to write the table as a file of its own")
  with open(path, "w", encoding="utf-8") as f:
    f.write(pattern.sub(lambda _: f"{BLOCK_BEGIN}\n{text}{BLOCK_END}", page, count=1))


def parse_args(argv=None):
  p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
  p.add_argument("--kinds", type=lambda s: s.split(","), default=None,
                 help="attention kinds (default: every registered kind)")
  p.add_argument("--lengths", type=ints, default=[256, 512, 1024, 2048, 4096, 8192, 16384])
  p.add_argument("--d_model", type=int, default=128)
  p.add_argument("--heads", type=int, default=2)
  p.add_argument("--repeats", type=int, default=5, help="timed calls at L <= 2048 (fewer above)")
  p.add_argument("--mem_cap_gib", type=float, default=6.0,
                 help="skip (not run) a point whose compiled memory exceeds this")
  p.add_argument("--fit_from", type=int, default=0, help="fit slopes over L >= this")
  p.add_argument("--out", default="attention_kinds.json", help="JSON results")
  p.add_argument("--md", default="", help="markdown table (default: none)")
  p.add_argument("--md_block", action="store_true",
                 help=f"--md is a page: replace its block {BLOCK_BEGIN} ... {BLOCK_END}")
  cfg = p.parse_args(argv)
  if any(n < 1 for n in cfg.lengths) or cfg.heads < 1 or cfg.d_model % cfg.heads:
    p.error("--lengths must be positive and --d_model a multiple of --heads")
  return cfg


@cli.guarded  # a bad flag or setting: one `error:` line, exit 2 (tfjax/training/entry/cli.py)
def main(argv=None):
  cfg = parse_args(argv)
  device = jax.devices()[0]
  argv = sys.argv[1:] if argv is None else argv
  meta = dict(device=f"{device.platform}:{device.device_kind}", jax=jax.__version__,
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              d_model=cfg.d_model, heads=cfg.heads, fit_from=cfg.fit_from,
              mem_cap_gib=cfg.mem_cap_gib,
              command="python experiments/bench_attention_kinds.py " + " ".join(argv))
  rows, start = [], time.perf_counter()
  for kind, impl in variants(cfg.kinds):
    for seq_len in cfg.lengths:
      rows.append(measure(kind, impl, seq_len, cfg))
      print(json.dumps(rows[-1]), flush=True)
  meta["wall_s"] = round(time.perf_counter() - start, 1)
  result = dict(meta=meta, rows=rows, fits=fits(rows, cfg.fit_from), crossovers=crossovers(rows))
  os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
  with open(cfg.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  if cfg.md:
    write_markdown(cfg.md, markdown(result), cfg.md_block)
  for f in result["fits"]:
    print(f"{f['kind']}/{f['impl']}: time slope {_fmt(f['time_slope'], '.2f')}, memory slope "
          f"{_fmt(f['memory_slope'], '.2f')} ({f['points']} points)")
  for c in result["crossovers"]:
    print(f"{c['kind']}/{c['impl']} vs {c['against']}: time {describe_crossover(c['time'])}; "
          f"memory {describe_crossover(c['memory'])}")
  return result


if __name__ == "__main__":
  main()
