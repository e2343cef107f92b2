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


def test_crossover_interpolates_log_log_between_the_bracketing_lengths():
  module = _module()
  # Ratios 2 at L=1000 and 0.5 at L=4000: log ratio is linear in log L, zero halfway between
  # log 1000 and log 4000, i.e. at sqrt(1000 * 4000) = 2000.
  c = module.crossover([1000, 4000], [100.0, 100.0], [50.0, 200.0])
  assert c["status"] == "crosses" and c["length"] == pytest.approx(2000.0)
  assert c["crossings"] == [[pytest.approx(2000.0), "cheaper above"]]
  assert c["range"] == [1000, 4000]
  assert module.describe_crossover(c) == "from ≈ 2,000"
  # O(L) kind 0.5 L against O(L²) L²/1024: dearer at 256 (128 vs 64), equal at 512 (256 vs 256:
  # an equal cost pays), cheaper at 1024 (512 vs 1024): it meets softmax exactly at 512.
  lengths = [256, 512, 1024]
  c = module.crossover(lengths, [0.5 * n for n in lengths], [n * n / 1024 for n in lengths])
  assert c["status"] == "crosses" and c["length"] == pytest.approx(512.0)
  # Ratio 3 at 100, 1/3 at 900: log ratio 0 at log 100 + 1/2 log 9 -> 300.
  c = module.crossover([100, 900, 8100], [3.0, 1.0, 1.0], [1.0, 3.0, 9.0])
  assert c["length"] == pytest.approx(300.0)


def test_crossover_below_and_not_within_the_measured_range():
  module = _module()
  c = module.crossover([256, 512], [1.0, 2.0], [2.0, 8.0])
  assert c["status"] == "below" and c["length"] is None and c["crossings"] == []
  assert module.describe_crossover(c) == "< 256 (cheaper at every measured L)"
  c = module.crossover([256, 512], [4.0, 16.0], [2.0, 8.0])
  assert c["status"] == "not_within" and c["length"] is None
  assert module.describe_crossover(c) == "not within 256-512 (dearer at 512)"
  # Cheaper at 100 (ratio 1/2), dearer at 400 (ratio 2): pays only below 100 * 4^(1/2) = 200.
  c = module.crossover([100, 400], [1.0, 8.0], [2.0, 4.0])
  assert c["status"] == "not_within"
  assert c["crossings"] == [[pytest.approx(200.0), "dearer above"]]
  assert module.describe_crossover(c) == (
      "not within 100-400 (dearer at 400); cheaper only below ≈ 200")
  # Dearer at 100 (ratio 2), cheaper at 400 (1/2), dearer at 1600 (2): cheaper only between
  # 100 * 4^(1/2) = 200 and 400 * 4^(1/2) = 800.
  c = module.crossover([100, 400, 1600], [2.0, 1.0, 2.0], [1.0, 2.0, 1.0])
  assert c["status"] == "not_within"
  assert module.describe_crossover(c) == (
      "not within 100-1600 (dearer at 1600); cheaper only between ≈ 200 and ≈ 800")
  # Cheaper at 100 (1/2), dearer at 400 (2), cheaper at 1600 (1/2): pays from 800, also below 200.
  c = module.crossover([100, 400, 1600], [1.0, 2.0, 1.0], [2.0, 1.0, 2.0])
  assert c["status"] == "crosses" and c["length"] == pytest.approx(800.0)
  assert module.describe_crossover(c) == "from ≈ 800; also cheaper below ≈ 200"
  # A length one side did not measure is left out; no common length at all is said so.
  c = module.crossover([100, 200, 400], [3.0, None, 1.0], [1.0, 5.0, 3.0])
  assert c["length"] == pytest.approx(200.0) and c["range"] == [100, 400]
  assert module.crossover([100], [None], [1.0])["status"] == "no_points"


def test_crossovers_compare_each_kind_with_both_softmax_impls():
  module = _module()
  lengths = [256, 1024, 4096]
  rows = []
  for n in lengths:
    skipped = n == 4096  # over the memory cap: compiled memory known, never timed
    rows.append(dict(kind="softmax", impl="xla", seq_len=n, peak_bytes=n * n,
                     status="skipped: cap" if skipped else "ok",
                     **({} if skipped else dict(time_ms=n * n / 1e3))))
    rows.append(dict(kind="softmax", impl="chunked", seq_len=n, peak_bytes=1000 * n, status="ok",
                     time_ms=n * n / 1e3))
    rows.append(dict(kind="lin", impl="xla", seq_len=n, peak_bytes=2048 * n, status="ok",
                     time_ms=4 * n))
  (vs_xla, vs_chunked) = module.crossovers(rows)
  assert (vs_xla["kind"], vs_xla["against"], vs_chunked["against"]) == (
      "lin", "softmax/xla", "softmax/chunked")
  # Memory 2048 n vs n²: ratio 8 at 256, 2 at 1024, 1/2 at 4096 (the skipped point's memory):
  # log ratio from log 2 to -log 2 over log 1024 .. log 4096 -> zero at 2048.
  assert vs_xla["memory"]["length"] == pytest.approx(2048.0)
  # Time 4 n vs n²/1000: ratio 4000/256 at 256, 4000/1024 at 1024; 4096 was not timed.
  assert vs_xla["time"]["status"] == "not_within" and vs_xla["time"]["range"] == [256, 1024]
  # Against chunked (timed at 4096 too) the ratio 4000 / n is exactly log-linear: 1 at 4000.
  assert vs_chunked["time"]["status"] == "crosses"
  assert vs_chunked["time"]["length"] == pytest.approx(4000.0)
  assert vs_chunked["memory"]["status"] == "not_within"  # 2048 n against 1000 n everywhere
  text = module.markdown(dict(meta=dict(device="cpu", jax="x", date="d", command="c", d_model=8,
                                        heads=2, fit_from=0),
                              rows=rows, fits=module.fits(rows, 0),
                              crossovers=module.crossovers(rows)))
  assert "| lin | xla | softmax/xla | not within 256-1024 (dearer at 1024) | from ≈ 2,048 |" in text
