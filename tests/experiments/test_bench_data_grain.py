"""experiments/bench_data_grain.py (bench_data.py's grain comparison) on a 1 MB prepared directory:
every grain loader yields the prepared loader's batches, ArrayRecord reads the pread windows, and
without grain the comparison is skipped with the reason."""

import argparse
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import bench_data  # pylint: disable=wrong-import-position
import bench_data_grain  # pylint: disable=wrong-import-position


def run_grain_comparison(tmp_path, workers):
  pytest.importorskip("grain.python")
  pytest.importorskip("array_record.python.array_record_module")
  args = argparse.Namespace(grain_corpus_mb=1, grain_batches=9, grain_repeats=1,
                            grain_workers=workers)
  report = bench_data.bench_grain(args, str(tmp_path))

  loaders = {(row["mode"], row["loader"]) for row in report["loaders"]}
  # two modes x (tfjax, record = batch for each worker count, record = row)
  assert len(loaders) == 2 * (2 + len(workers))
  for row in report["loaders"]:
    assert row["same_batches"], row  # batches 0..7 and 9 equal PreparedDataset.train_batch's
    assert row["tokens_per_s"] > 0 and len(row["rest_s"]) == 1
  [pread, array_record] = report["random_access"]
  assert pread["windows"] == array_record["windows"] == 9 * bench_data_grain.ROWS
  assert array_record["same_windows"] and array_record["width"] == bench_data_grain.SEQ_LEN + 1
  assert pread["batch_1_as_loader"] and array_record["batch_1_as_loader"]
  # 1 MB of uint16 = 500,000 tokens in 4,096-token records.
  assert os.path.getsize(os.path.join(tmp_path, "grain_1mb", "train_00000.arrayrecord")) >= 1e6
  text = "\n".join(bench_data_grain.markdown(report))
  assert "ArrayRecordReader" in text and "False" not in text
  return text


def test_grain_comparison_reads_the_same_rows(tmp_path):
  assert "worker_count=0" in run_grain_comparison(tmp_path, [0])


@pytest.mark.slow  # two worker-process start-ups and shutdowns: ~7 s on 2 cores
def test_grain_worker_processes_read_the_same_rows(tmp_path):
  assert "worker_count=1" in run_grain_comparison(tmp_path, [1])


def test_without_grain_the_comparison_is_skipped_with_the_reason(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "grain.python", None)  # import grain.python -> ImportError
  args = argparse.Namespace(grain_corpus_mb=1, grain_batches=2, grain_repeats=1, grain_workers=[0])
  report = bench_data.bench_grain(args, str(tmp_path))
  assert set(report) == {"skipped"} and "pip install 'tfjax[grain]'" in report["skipped"]
  assert not os.listdir(tmp_path)  # nothing written
  assert "grain comparison skipped" in bench_data_grain.markdown(report)[-1]
