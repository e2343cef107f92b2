"""tfjax/data/prepared.py: training batches from a prepared directory (data.name='prepared').

Documents are known byte strings, so every row is checked against the corpus itself: windows are
slices of one shard, packed segments are pieces of one document, row r of batch i does not
depend on which process builds it or on what came before."""

import json
import os
import shutil

import numpy as np
import pytest

from tfjax.data import prepare as prep
from tfjax.data import datasets
from tfjax.training.loop import experiment
from tfjax.training.config.defaults import base_config
from tfjax.data.tokenizers import ByteTokenizer

L = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Byte-tokenized documents of 1 to 60 tokens (many longer than a row), in several shards."""
  root = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  docs = ["".join(rng.choice(list("abcdefghij"), size=int(rng.integers(1, 61))))
          for _ in range(400)]
  with open(root / "c.jsonl", "w") as f:
    for d in docs:
      f.write(json.dumps({"text": d}) + "\n")
  prep.prepare(str(root / "c.jsonl"), "byte", str(root / "prepared"), val_docs=40,
               shard_mb=0.002, workers=1, progress=False, min_val_tokens=0)
  return str(root / "prepared"), docs


def dataset(path, **kwargs):
  config = datasets.default_data_config()
  config.update(name="prepared", path=path, **{"seq_len": L, **kwargs})
  return datasets.make_dataset(config, "lm")


def test_random_windows_are_slices_of_one_shard(corpus):
  path, _ = corpus
  ds = dataset(path)
  manifest = ds.manifest
  shards = [bytes(np.load(os.path.join(path, s["tokens"])).astype(np.uint8))
            for s in manifest["splits"]["train"]["shards"]]
  assert len(shards) > 2 and ds.vocab_size == 256 and isinstance(ds.tokenizer, ByteTokenizer)
  starts = set()
  for index in range(20):
    batch = ds.train_batch(index, 8)
    assert batch["inputs"].shape == (8, L) and batch["inputs"].dtype == np.int32
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    for row_in, row_t in zip(batch["inputs"], batch["targets"]):
      window = bytes(np.concatenate([row_in, row_t[-1:]]).astype(np.uint8))
      holders = [s for s in shards if window in s]
      assert holders, window
      starts.add(window)
  assert len(starts) > 150  # windows vary (160 drawn)


def test_global_batch_is_the_same_for_one_and_two_processes(corpus):
  path, _ = corpus
  for mode in ("random", "packed"):
    ds = dataset(path, mode=mode, seed=3)
    for index in (0, 7, 1000):
      whole = ds.train_batch(index, 8)
      halves = [ds.train_batch(index, 8, row_start=p * 4, row_count=4) for p in range(2)]
      quarter = ds.train_batch(index, 8, row_start=2, row_count=2)
      for key, value in whole.items():
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), value)
        np.testing.assert_array_equal(quarter[key], value[2:4])
    # A fresh dataset object (another process) draws the same rows; another seed does not.
    np.testing.assert_array_equal(dataset(path, mode=mode, seed=3).train_batch(5, 8)["inputs"],
                                  ds.train_batch(5, 8)["inputs"])
    assert not np.array_equal(dataset(path, mode=mode, seed=4).train_batch(5, 8)["inputs"],
                              ds.train_batch(5, 8)["inputs"])


PROCESS_ROWS = """
import sys, numpy as np
from tfjax.data import datasets
path, mode, process, count, out = sys.argv[1:]
config = datasets.default_data_config()
config.update(name="prepared", path=path, seq_len=16, mode=mode, seed=7)
it = datasets.DataIterator(datasets.make_dataset(config, "lm"), 8, start_index=2,
                       row_start=int(process) * int(count), row_count=int(count))
np.savez(out, *[it.next()["inputs"] for _ in range(4)])
"""


def test_two_real_processes_build_the_one_process_global_batch(corpus, tmp_path):
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  path, _ = corpus
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for mode in ("random", "packed"):
    runs = [(p, 4, tmp_path / f"{mode}_{p}_of_2.npz") for p in range(2)] + [
        (0, 8, tmp_path / f"{mode}_one.npz")]
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS_ROWS, path, mode, str(p), str(n),
                               str(out)], env=dict(os.environ, PYTHONPATH=repo))
             for p, n, out in runs]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0, 0]
    halves = [np.load(out) for _, _, out in runs[:2]]
    one = np.load(runs[2][2])
    for b in range(4):
      np.testing.assert_array_equal(
          np.concatenate([h[f"arr_{b}"] for h in halves]), one[f"arr_{b}"])
    assert not np.array_equal(one["arr_0"], one["arr_1"])


class RecordingArray:
  """A shard standing in for the memory map, recording which token ranges are read."""

  def __init__(self, array):
    self.array, self.reads = array, []

  def __len__(self):
    return len(self.array)

  def __getitem__(self, key):
    self.reads.append(key)
    return self.array[key]


def test_each_process_reads_only_its_own_rows(corpus):
  path, _ = corpus
  ds = dataset(path)
  split = ds._splits["train"]  # pylint: disable=protected-access
  split.tokens = [RecordingArray(t) for t in split.tokens]
  mine = ds.train_batch(2, 8, row_start=4, row_count=2)
  reads = [r for t in split.tokens for r in t.reads]
  assert len(reads) == 2 and all(r.stop - r.start == L + 1 for r in reads)
  np.testing.assert_array_equal(mine["inputs"], dataset(path).train_batch(2, 8)["inputs"][4:6])


def test_iterator_resumes_exactly_from_the_batch_index(corpus):
  path, _ = corpus
  ds = dataset(path, mode="packed")
  straight = datasets.DataIterator(ds, 4)
  expected = [straight.next() for _ in range(6)]
  first = datasets.DataIterator(ds, 4)
  got = [first.next() for _ in range(3)]
  resumed = datasets.DataIterator(dataset(path, mode="packed"), 4)
  resumed.restore(json.loads(json.dumps(first.state())))
  got += [resumed.next() for _ in range(3)]
  for a, b in zip(expected, got):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("L", [16, 64])  # shorter than most documents / longer than all
def test_packed_rows_never_cross_documents(corpus, L):
  path, docs = corpus
  ds = dataset(path, mode="packed", seq_len=L)
  pieces = {d[i:i + L] for d in docs for i in range(0, len(d), L)}
  segments_per_row = []
  for index in range(30):
    batch = ds.train_batch(index, 8)
    for b in range(8):
      seg, tokens = batch["segment_ids"][b], batch["inputs"][b]
      ids = [s for s in np.unique(seg) if s]
      assert ids == list(range(1, len(ids) + 1))
      assert np.all(np.diff(np.flatnonzero(seg)) == 1) and (seg[0] == 1)  # padding at the end
      for s in ids:
        where = np.flatnonzero(seg == s)
        piece = bytes(tokens[where].astype(np.uint8)).decode()
        assert piece in pieces  # a whole piece of one document, nothing from its neighbours
        np.testing.assert_array_equal(batch["positions"][b][where], np.arange(len(where)))
        # Targets: the next token of the same piece; the piece's last token predicts nothing.
        np.testing.assert_array_equal(batch["targets"][b][where[:-1]], tokens[where[1:]])
        assert batch["weights"][b][where[-1]] == 0 and np.all(batch["weights"][b][where[:-1]] == 1)
      segments_per_row.append(len(ids))
      assert np.all(batch["weights"][b][seg == 0] == 0)
  assert min(segments_per_row) >= 1
  if L == 64:  # whole documents of 1-60 tokens (30 on average): rows hold several
    assert np.mean(segments_per_row) > 1.5
  # Sequential eval packs the val documents (>= 2 tokens) and predicts within each piece.
  val = ds.eval_batches(8, mode="sequential")
  assert sum(float(b["weights"].sum()) for _, b in val) == sum(
      len(d[i:i + L]) - 1 for d in docs[:40] if len(d) >= 2 for i in range(0, len(d), L))


def test_sequential_eval_counts_every_val_target_once(corpus):
  path, docs = corpus
  ds = dataset(path)
  batches = ds.eval_batches(8, mode="sequential")
  val_text = "".join(docs[:40])
  assert sum(float(b["weights"].sum()) for _, b in batches) == len(val_text) - 1
  assert bytes(ds.val_tokens.astype(np.uint8)).decode() == val_text


def test_corrupted_or_missing_shards_are_caught(corpus, tmp_path):
  path, _ = corpus
  copy = str(tmp_path / "copy")
  shutil.copytree(path, copy)
  shard = os.path.join(copy, "train_00001.tokens.npy")
  raw = bytearray(open(shard, "rb").read())
  raw[-1] ^= 1  # one flipped bit in the last token
  open(shard, "wb").write(bytes(raw))
  with pytest.raises(ValueError, match="train_00001.tokens.npy: checksum differs"):
    dataset(copy)
  dataset(copy, verify="size")  # sizes alone cannot see a flipped bit (documented)
  np.save(shard, np.zeros(3, np.uint16))
  with pytest.raises(ValueError, match="3 entries, the manifest says"):
    dataset(copy, verify="size")
  os.remove(shard)
  with pytest.raises(ValueError, match="shard missing"):
    dataset(copy)
  os.remove(os.path.join(copy, "manifest.json"))
  with pytest.raises(ValueError, match="no manifest.json: it is not a finished prepared"):
    dataset(copy)


def test_tokenizer_and_vocabulary_checks(corpus, tmp_path):
  path, _ = corpus
  with pytest.raises(ValueError, match="prepared with tokenizer 'byte' but the config expects "
                                       "'gpt2'"):
    dataset(path, expect_tokenizer="gpt2")
  dataset(path, expect_tokenizer="byte")
  run = tmp_path / "run"
  run.mkdir()
  (run / "tokenizer.json").write_text(json.dumps({"type": "char", "chars": "ab"}))
  config = datasets.default_data_config()
  config.update(name="prepared", path=path, seq_len=L)
  with pytest.raises(ValueError, match="not the tokenizer of the run in"):
    datasets.make_dataset(config, "lm", workdir=str(run))
  ByteTokenizer().save(str(run))  # the run's own tokenizer, saved by training: accepted
  datasets.make_dataset(config, "lm", workdir=str(run))

  full = base_config()
  full.data.update(name="prepared", path=path, seq_len=L)
  full.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                    d_ff=32, max_len=L)
  assert datasets.resolve_vocab_size(full) == 256  # from the manifest, without opening shards
  full.task = "mlm"
  assert datasets.resolve_vocab_size(full) == 257
  full.task = "lm"
  full.model.vocab_size = 200
  with pytest.raises(ValueError, match="model.vocab_size=200 is smaller than the data's "
                                       "vocabulary \\(256\\)"):
    experiment.prepare(full)


def test_masked_lm_rows_are_masked_corpus_windows(corpus):
  path, _ = corpus
  config = datasets.default_data_config()
  config.update(name="prepared", path=path, seq_len=L, seed=5)
  ds = datasets.make_dataset(config, "mlm")
  batch = ds.train_batch(2, 64)
  assert ds.vocab_size == 257 and ds.mask_id == 256
  selected = batch["weights"] > 0
  assert 0.05 < selected.mean() < 0.3 and np.all(batch["inputs"][~selected] ==
                                                 batch["targets"][~selected])
  assert (batch["inputs"] == 256).any() and batch["inputs"].max() <= 256
  # An mlm row is L tokens of one shard (not L+1): every target row is a window of the corpus.
  corpus_bytes = b"".join(bytes(np.load(os.path.join(path, s["tokens"])).astype(np.uint8))
                          for s in ds.manifest["splits"]["train"]["shards"])
  assert all(bytes(row.astype(np.uint8)) in corpus_bytes for row in batch["targets"])
