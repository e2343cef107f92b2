"""experiments/bench_attention_kinds.py at toy lengths on the CPU: the JSON it writes, full
attention's memory holding the L x L scores, the log-log slope fit against synthetic (L, y) pairs
of known exponent, the markdown block it rewrites, and its errors."""

import importlib.util
import json
import math
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "bench_attention_kinds.py")


def _module():
  spec = importlib.util.spec_from_file_location("bench_attention_kinds_under_test", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_toy_run_writes_every_softmax_impl_with_times_memory_and_fits(tmp_path):
  module = _module()
  out, md = tmp_path / "kinds.json", tmp_path / "kinds.md"
  module.main(["--kinds=softmax", "--lengths=64,128", "--repeats=1", "--d_model=32",
               "--heads=2", f"--out={out}", f"--md={md}"])
  result = json.loads(out.read_text())
  meta = result["meta"]
  assert meta["device"].startswith("cpu") and meta["jax"] and meta["date"]
  assert "--kinds=softmax" in meta["command"]
  assert [(r["kind"], r["impl"], r["seq_len"]) for r in result["rows"]] == [
      ("softmax", "xla", 64), ("softmax", "xla", 128),
      ("softmax", "chunked", 64), ("softmax", "chunked", 128)]
  for r in result["rows"]:
    assert r["status"] == "ok" and r["time_ms"] > 0
    assert r["peak_bytes"] == r["temp_bytes"] + r["argument_bytes"]
  # Full attention materializes the [heads, L, L] float32 scores (at least once) at L = 128.
  xla_128 = result["rows"][1]
  assert xla_128["temp_bytes"] >= 2 * 128 * 128 * 4
  assert [(f["kind"], f["impl"], f["points"]) for f in result["fits"]] == [
      ("softmax", "xla", 2), ("softmax", "chunked", 2)]
  for f in result["fits"]:  # two points: the slope is the line through them
    rows = [r for r in result["rows"] if r["impl"] == f["impl"]]
    expected = math.log(rows[1]["peak_bytes"] / rows[0]["peak_bytes"]) / math.log(2)
    assert f["memory_slope"] == pytest.approx(expected)
  text = md.read_text()
  assert "| softmax | chunked | 128 |" in text and "memory slope" in text


def test_slope_fit_recovers_known_exponents():
  module = _module()
  lengths = [1024, 2048, 4096, 8192, 16384]
  assert module.loglog_slope(lengths, [3e-6 * n ** 2 for n in lengths]) == pytest.approx(2.0)
  assert module.loglog_slope(lengths, [0.5 * n for n in lengths]) == pytest.approx(1.0)
  # Written out: (L, t) = (1k, 10), (2k, 30), (4k, 90) is t ~ L^log2(3) = L^1.585.
  assert module.loglog_slope([1024, 2048, 4096], [10, 30, 90]) == pytest.approx(1.58496, 1e-4)
  assert module.loglog_slope([1024], [1.0]) is None
  rows = [dict(kind="k", impl="xla", seq_len=n, status="ok", time_ms=n ** 1.5,
               peak_bytes=7 * n) for n in lengths]
  rows.append(dict(kind="k", impl="xla", seq_len=32768, status="skipped: too big"))
  rows.append(dict(kind="k", impl="xla", seq_len=512, status="ok", time_ms=1e9,
                   peak_bytes=1))  # below --fit_from: left out of the fit
  (fit,) = module.fits(rows, fit_from=1024)
  assert fit["points"] == 5 and fit["lengths"] == "1024-16384"
  assert fit["time_slope"] == pytest.approx(1.5) and fit["memory_slope"] == pytest.approx(1.0)


def test_markdown_block_is_replaced_and_a_page_without_one_is_an_error(tmp_path):
  module = _module()
  page = tmp_path / "page.md"
  page.write_text(f"intro\n{module.BLOCK_BEGIN}\nold\n{module.BLOCK_END}\noutro\n")
  module.write_markdown(str(page), "| new |\n", block=True)
  assert page.read_text() == (f"intro\n{module.BLOCK_BEGIN}\n| new |\n{module.BLOCK_END}\n"
                              "outro\n")
  bare = tmp_path / "bare.md"
  bare.write_text("no markers\n")
  with pytest.raises(ValueError, match="attention_kinds:begin"):
    module.write_markdown(str(bare), "x\n", block=True)


def test_unknown_kind_names_the_registered_ones():
  with pytest.raises(ValueError, match="registered kinds: .*softmax"):
    _module().variants(["nope"])
