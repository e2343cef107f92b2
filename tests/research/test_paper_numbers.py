"""Every published number the ablation claims quote is held here with its paper, table (or
figure) and row, written from the papers; a claim quoting a number not listed for its sweep, or a
config constant that drifts from the listed value, fails. Numbers read off a figure's curves
(Press et al.) are marked as such: they are the papers' own wording of those curves."""

import os
import re

import pytest

from tfjax.research import sweep, sweep_doc

# sweep -> {(paper, table/figure, row): value}
QUOTED = {
    "ffn": {  # Shazeer 2020, "GLU Variants Improve Transformer": held-out log-perplexity
        ("Shazeer 2020", "table 1", "FFN_ReLU"): 1.997,
        ("Shazeer 2020", "table 1", "FFN_GELU"): 1.983,
        ("Shazeer 2020", "table 1", "FFN_Swish"): 1.994,
        ("Shazeer 2020", "table 1", "FFN_GLU"): 1.982,
        ("Shazeer 2020", "table 1", "FFN_Bilinear"): 1.960,
        ("Shazeer 2020", "table 1", "FFN_ReGLU"): 1.953,
        ("Shazeer 2020", "table 1", "FFN_GEGLU"): 1.942,
        ("Shazeer 2020", "table 1", "FFN_SwiGLU"): 1.944,
    },
    "heads": {  # Vaswani et al. 2017, table 3, dev perplexity (newstest2013)
        ("Vaswani 2017", "table 3", "(A) 1 head, d_k 512"): 5.29,
        ("Vaswani 2017", "table 3", "(A) 4 heads, d_k 128"): 5.00,
        ("Vaswani 2017", "table 3", "base, 8 heads, d_k 64"): 4.92,
        ("Vaswani 2017", "table 3", "(A) 16 heads, d_k 32"): 4.91,
        ("Vaswani 2017", "table 3", "(A) 32 heads, d_k 16"): 5.01,
        ("Vaswani 2017", "table 3", "(B) 8 heads: the row count"): 8,
    },
    "position": {
        ("Vaswani 2017", "table 3", "base (sinusoidal), dev perplexity"): 4.92,
        ("Vaswani 2017", "table 3", "(E) learned positions, dev perplexity"): 4.92,
        ("Vaswani 2017", "table 3", "base (sinusoidal), BLEU"): 25.8,
        ("Vaswani 2017", "table 3", "(E) learned positions, BLEU"): 25.7,
        ("Press 2021", "figure 1", "longest evaluation length (k tokens)"): 15.5,
        ("Press 2021", "figure 1", "training length L"): 512,
        ("Press 2021", "figure 1 (curves)", "rotary: extra tokens before degrading, low"): 100,
        ("Press 2021", "figure 1 (curves)", "rotary: extra tokens before degrading, high"): 200,
        ("Press 2021", "figure 1 (curves)", "T5 bias: extra tokens before degrading, low"): 600,
        ("Press 2021", "figure 1 (curves)", "T5 bias: extra tokens before degrading, high"): 800,
    },
    "position_lengthgen": {  # Kazemnejad et al. 2023, figure 1: mean reciprocal rank
        ("Kazemnejad 2023", "figure 1", "NoPE"): 0.69,
        ("Kazemnejad 2023", "figure 1", "T5's relative bias"): 0.55,
        ("Kazemnejad 2023", "figure 1", "ALiBi"): 0.50,
        ("Kazemnejad 2023", "figure 1", "Rotary"): 0.33,
        ("Kazemnejad 2023", "figure 1", "absolute (sinusoidal)"): 0.22,
    },
    "norm": {
        ("Xiong 2020", "figure 2", "post-LN without warmup, BLEU"): 8.45,
        ("Xiong 2020", "figure 2", "post-LN with warmup, BLEU (approximate)"): 34,
        ("Xiong 2020", "figure 2", "depth (layers)"): 6,
        ("Zhang & Sennrich 2019", "abstract", "running time cut, low (%)"): 7,
        ("Zhang & Sennrich 2019", "abstract", "running time cut, high (%)"): 64,
    },
    "lra_listops": {  # Tay et al. 2021, "Long Range Arena", table 1, ListOps accuracy (%)
        ("Tay 2021", "table 1", "Transformer"): 36.37,
        ("Tay 2021", "table 1", "Local Attention"): 15.82,
        ("Tay 2021", "table 1", "Performer"): 18.01,
        ("Tay 2021", "table 1", "Linformer"): 35.70,
        ("Tay 2021", "table 1", "Longformer"): 35.63,
        ("Tay 2021", "table 1", "BigBird"): 36.05,
    },
}
# Citations, years and row names are no quoted results.
_NOT_NUMBERS = re.compile(r"(table|figure|section|fig\.)\s*\d+(\.\d+)*|\b(19|20)\d\d\b|"
                          r"\([A-E]\)")


def _numbers(text):
  # Not a digit inside a name ("T5", "W_2").
  return [float(x) for x in re.findall(r"(?<![A-Za-z\d._])\d+(?:\.\d+)?",
                                       _NOT_NUMBERS.sub(" ", text))]


@pytest.mark.parametrize("name", sorted(QUOTED))
def test_every_number_a_claim_quotes_is_a_listed_paper_number(name):
  listed = set(QUOTED[name].values())
  for scale in ("smoke", "medium", "full"):
    module = sweep.load_module(os.path.join(sweep_doc.REPO, "configs", "ablations", f"{name}.py"))
    for claim in module.CLAIMS(scale):
      for number in _numbers(claim["paper"]):
        assert number in listed, (name, claim["id"], claim["paper"], number)


def test_the_configs_tables_of_published_numbers_match_the_papers():
  path = lambda n: os.path.join(sweep_doc.REPO, "configs", "ablations", f"{n}.py")  # noqa: E731
  ffn = sweep.load_module(path("ffn")).PUBLISHED
  names = {"relu": "ReLU", "gelu": "GELU", "silu": "Swish", "glu": "GLU",
           "bilinear": "Bilinear", "reglu": "ReGLU", "geglu": "GEGLU", "swiglu": "SwiGLU"}
  assert ffn == {k: QUOTED["ffn"][("Shazeer 2020", "table 1", f"FFN_{v}")]
                 for k, v in names.items()}
  heads = sweep.load_module(path("heads")).PUBLISHED_PPL
  rows = {1: "(A) 1 head, d_k 512", 4: "(A) 4 heads, d_k 128", 8: "base, 8 heads, d_k 64",
          16: "(A) 16 heads, d_k 32", 32: "(A) 32 heads, d_k 16"}
  assert heads == {h: QUOTED["heads"][("Vaswani 2017", "table 3", r)] for h, r in rows.items()}
  mrr = sweep.load_module(path("position_lengthgen")).PUBLISHED_MRR
  rows = {"none": "NoPE", "t5_bias": "T5's relative bias", "alibi": "ALiBi", "rope": "Rotary",
          "sinusoidal": "absolute (sinusoidal)"}
  assert mrr == {k: QUOTED["position_lengthgen"][("Kazemnejad 2023", "figure 1", r)]
                 for k, r in rows.items()}
  shape = sweep.load_module(path("norm_init")).BASE_SHAPE  # Vaswani et al.'s base model
  keys = {"num_layers": "base, N (layers)", "d_model": "base, d_model", "d_ff": "base, d_ff",
          "num_heads": "base, h (heads)"}
  assert shape == {k: QUOTED_IN_PROSE[("Vaswani 2017", "table 3", r)][0] for k, r in keys.items()}
  lra = sweep.load_module(path("lra_listops"))
  assert lra.PUBLISHED == {k: QUOTED["lra_listops"][("Tay 2021", "table 1", r)]
                           for k, r in lra.LRA_NAMES.items()}


def test_the_number_filter_keeps_results_and_drops_citations():
  assert _numbers("dev ppl 4.92 vs 4.91 (table 3, row (A) vs base), 2017") == [4.92, 4.91]
  assert _numbers("T5 600-800 extra tokens (figure 1)") == [600.0, 800.0]


def _doc():
  with open(os.path.join(sweep_doc.REPO, "docs", "ablations.md"), encoding="utf-8") as f:
    return f.read()


def _points(name, scale):
  path = os.path.join(sweep_doc.REPO, "configs", "ablations", f"{name}.py")
  return len(sweep.load_module(path).get_sweep(scale))


def test_the_docs_point_counts_equal_the_configs_sweeps():
  """Every point count in the prose tables of docs/ablations.md (Setup's smoke / medium / full
  table, the smoke runtime table, the full-scale line) is len(get_sweep(scale)) of its config,
  so a changed grid cannot leave a stale count behind."""
  doc = _doc()
  setup = dict((m[0], tuple(map(int, m[1:]))) for m in
               re.findall(r"^\| (\w+) \| (\d+) / (\d+) / (\d+)\b", doc, flags=re.M))
  names = ("position", "position_lengthgen", "norm", "norm_init", "ffn", "heads", "lra_listops")
  assert sorted(setup) == sorted(names), setup
  for name, counts in setup.items():
    assert counts == tuple(_points(name, s) for s in ("smoke", "medium", "full")), name
  smoke = re.findall(r"^\| [^|]+ \| (\d+) \| `python experiments/sweep\.py "
                     r"--config=configs/ablations/(\w+)\.py --scale=smoke", doc, flags=re.M)
  assert len(smoke) == 5, smoke
  for count, name in smoke:
    assert int(count) == _points(name, "smoke"), name
  full = re.search(r"Point counts at full scale: (.*?)\.\n", doc, flags=re.S).group(1)
  full = re.sub(r"\s*\([^)]*\)", "", full.replace("\n", " "))
  pairs = re.findall(r"(\w+) (\d+)", full)
  assert len(pairs) == 5, full
  for name, count in pairs:
    assert int(count) == _points(name, "full"), name


# Paper numbers quoted in the prose of docs/ablations.md (not in a claim's 'paper' field):
# (paper, table/figure/section, row) -> (value, the doc's text that quotes it). Each value is
# the published one; the test finds the text in the doc and the value in the text.
QUOTED_IN_PROSE = {
    ("Vaswani 2017", "table 3", "(A) 1 head, d_k 512, BLEU"): (24.9, None),
    ("Vaswani 2017", "table 3", "(A) 4 heads, d_k 128, BLEU"): (25.5, None),
    ("Vaswani 2017", "table 3", "base, 8 heads, d_k 64, BLEU"): (25.8, None),
    ("Vaswani 2017", "table 3", "(A) 16 heads, d_k 32, BLEU"): (25.8, None),
    ("Vaswani 2017", "table 3", "(A) 32 heads, d_k 16, BLEU"): (25.4, None),
    ("Vaswani 2017", "table 3", "(B) d_k 16, dev perplexity"):
        (5.16, "8 heads with d_k 16 gives perplexity 5.16 (BLEU 25.1)"),
    ("Vaswani 2017", "table 3", "(B) d_k 16, BLEU"):
        (25.1, "8 heads with d_k 16 gives perplexity 5.16 (BLEU 25.1)"),
    ("Vaswani 2017", "table 3", "(B) d_k 32, dev perplexity"): (5.01, "d_k 32 gives 5.01 (25.4)"),
    ("Vaswani 2017", "table 3", "(B) d_k 32, BLEU"): (25.4, "d_k 32 gives 5.01 (25.4)"),
    ("Wang 2022 (DeepNet)", "table 1", "decoder-only, alpha"):
        ("(2N)^(1/4)", "alpha = (2N)^(1/4)"),
    ("Wang 2022 (DeepNet)", "table 1", "decoder-only, beta"):
        ("(8N)^(-1/4)", "beta = (8N)^(-1/4)"),
    ("Xiong 2020", "figure 2", "Post-LN warmup steps"): (4000, "where they use 4000"),
    # The base model's shape, the layer the norm_init section builds (table 3, row "base").
    ("Vaswani 2017", "table 3", "base, N (layers)"):
        (6, "table 3: 6 layers, d_model 512, d_ff 2048, 8 heads"),
    ("Vaswani 2017", "table 3", "base, d_model"):
        (512, "table 3: 6 layers, d_model 512, d_ff 2048, 8 heads"),
    ("Vaswani 2017", "table 3", "base, d_ff"):
        (2048, "table 3: 6 layers, d_model 512, d_ff 2048, 8 heads"),
    ("Vaswani 2017", "table 3", "base, h (heads)"):
        (8, "table 3: 6 layers, d_model 512, d_ff 2048, 8 heads"),
    ("Shazeer 2020", "table 1", "training steps of the quoted column"):
        ("65,536", "held-out log-perplexity after 65,536 steps"),
}
# Row (A) of Vaswani et al.'s table 3 as the heads section prints it, heads (d_k) in order.
_ROW_A = (("1 (512)", "(A) 1 head, d_k 512"), ("4 (128)", "(A) 4 heads, d_k 128"),
          ("8 (64)", "base, 8 heads, d_k 64"), ("16 (32)", "(A) 16 heads, d_k 32"),
          ("32 (16)", "(A) 32 heads, d_k 16"))


def test_every_paper_number_the_prose_quotes_is_held_with_its_table_and_row():
  doc = re.sub(r"\s+", " ", _doc())
  for key, (value, text) in QUOTED_IN_PROSE.items():
    if text is None:
      continue
    assert text in doc, (key, text)
    assert str(value) in text, (key, value, text)
  header = "| (A) heads (d_k) | " + " | ".join(h for h, _ in _ROW_A) + " |"
  bleu = "| BLEU | " + " | ".join(
      str(QUOTED_IN_PROSE[("Vaswani 2017", "table 3", f"{row}, BLEU")][0]) for _, row in _ROW_A)
  ppl = "| dev perplexity | " + " | ".join(
      f"{QUOTED['heads'][('Vaswani 2017', 'table 3', row)]:.2f}" for _, row in _ROW_A)
  assert f"{header} |---|---|---|---|---|---| {bleu} | {ppl} |" in doc
