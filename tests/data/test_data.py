"""Data layer: tokenizers, text datasets (random / packed, lm / mlm), determinism, errors."""

import json
import os

import numpy as np
import pytest

from tfjax.data import datasets, text_files, tokenizers
from tfjax.data.datasets import DataIterator, TextDataset, make_dataset, mask_tokens

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")
SAMPLE = "Hello wörld — ünïcode ✓\n\nsecond line\n"
from run_helpers import REPO, run_cli


def _paragraph_text(n=60, seed=0):
  """A small corpus of blank-line separated paragraphs of varying length."""
  rng = np.random.default_rng(seed)
  words = ["the", "king", "shall", "speak", "now", "my", "lord", "and", "fair", "rose"]
  paras = [" ".join(rng.choice(words, rng.integers(2, 30))) for _ in range(n)]
  return "\n\n".join(paras) + "\n"


def _config(**kw):
  c = datasets.default_data_config()
  c.update(kw)
  return c


def _text_file(tmp_path, text, name="corpus.txt"):
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def corpus():
  return _paragraph_text()


def _text_dataset(text, **kw):
  kw = {"seq_len": 32, "source": "corpus.txt", **kw}
  return TextDataset(text, tokenizers.CharTokenizer(text), **kw)


def test_random_lm_windows(corpus):
  ds = _text_dataset(corpus)
  cut = int(len(corpus) * 0.9)
  assert len(ds.train_tokens) == cut and len(ds.val_tokens) == len(corpus) - cut
  batch = ds.train_batch(0, 16)
  assert set(batch) == {"inputs", "targets", "weights"}
  assert batch["inputs"].shape == (16, 32) and batch["inputs"].dtype == np.int32
  assert batch["weights"].dtype == np.float32 and (batch["weights"] == 1).all()
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  train_text = corpus[:cut]
  for row in range(16):
    window = ds.decode(np.append(batch["inputs"][row], batch["targets"][row, -1]))
    assert window in train_text


def test_determinism_row_slicing_and_iterator(corpus):
  ds = _text_dataset(corpus)
  full = ds.train_batch(3, 8)
  part = ds.train_batch(3, 8, row_start=2, row_count=3)
  for k in full:
    np.testing.assert_array_equal(full[k], _text_dataset(corpus).train_batch(3, 8)[k])
    np.testing.assert_array_equal(full[k][2:5], part[k])
  assert not np.array_equal(full["inputs"], ds.train_batch(4, 8)["inputs"])
  reseeded = _text_dataset(corpus, seed=1).train_batch(3, 8)
  assert not np.array_equal(full["inputs"], reseeded["inputs"])

  it = DataIterator(ds, 8)
  first = [it.next() for _ in range(3)]
  state = json.loads(json.dumps(it.state()))
  assert state == {"index": 3}
  expected = next(it)
  resumed = DataIterator(ds, 8, row_start=4, row_count=4)
  resumed.restore(state)
  np.testing.assert_array_equal(resumed.next()["inputs"], expected["inputs"][4:])
  np.testing.assert_array_equal(first[0]["inputs"], ds.train_batch(0, 8)["inputs"])


def test_eval_batches(corpus):
  ds = _text_dataset(corpus)
  evals = ds.eval_batches(4, 3)
  assert [name for name, _ in evals] == ["val"] * 3
  other_seed = _text_dataset(corpus, seed=9).eval_batches(4, 3)
  for (_, a), (_, b) in zip(evals, other_seed):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])  # eval set fixed across runs
  val_text = ds.decode(ds.val_tokens)
  assert ds.decode(evals[0][1]["inputs"][0]) in val_text
  # Sequential: every validation target exactly once, in order; padding has weight 0.
  seq = ds.eval_batches(5, None, mode="sequential")
  targets = np.concatenate([b["targets"][b["weights"] > 0] for _, b in seq])
  np.testing.assert_array_equal(targets, ds.val_tokens[1:])
  assert all(b["inputs"].shape == (5, 32) for _, b in seq)
  assert len(ds.eval_batches(5, 2, mode="sequential")) == 2


def test_packed_lm(corpus):
  ds = _text_dataset(corpus, mode="packed", seq_len=64)
  batch = ds.train_batch(0, 32)
  assert set(batch) == {"inputs", "targets", "weights", "segment_ids", "positions"}
  paragraphs = corpus[:int(len(corpus) * 0.9)].split("\n\n")
  seg, pos, w = batch["segment_ids"], batch["positions"], batch["weights"]
  for r in range(32):
    n = int((seg[r] > 0).sum())
    assert (seg[r, n:] == 0).all() and (w[r, n:] == 0).all()  # padding only at the tail
    ids = seg[r, :n]
    assert ids[0] == 1 and set(np.diff(ids)) <= {0, 1}
    for s in range(1, ids.max() + 1):
      where = np.flatnonzero(seg[r] == s)
      np.testing.assert_array_equal(pos[r, where], np.arange(len(where)))
      doc = ds.decode(batch["inputs"][r, where])
      assert any(doc in p for p in paragraphs)  # a document never spans paragraphs
      # Targets predict the next token of the same document; its last token has weight 0.
      np.testing.assert_array_equal(batch["targets"][r, where[:-1]], batch["inputs"][r, where[1:]])
      assert (w[r, where[:-1]] == 1).all() and w[r, where[-1]] == 0
  part = ds.train_batch(0, 32, row_start=5, row_count=4)
  for k in batch:
    np.testing.assert_array_equal(batch[k][5:9], part[k])


def test_packed_sequential_eval_covers_val_rows(corpus):
  ds = _text_dataset(corpus, mode="packed", seq_len=64, doc_split="chunks", doc_chunk_tokens=20)
  seq = ds.eval_batches(4, None, mode="sequential")
  rows = np.concatenate([b["inputs"] for _, b in seq])
  n = len(ds._packed["val"]["tokens"])  # pylint: disable=protected-access
  np.testing.assert_array_equal(rows[:n], ds._packed["val"]["tokens"])
  assert not rows[n:].any()
  # Chunks of 20 tokens: three per 64-token row.
  assert (seq[0][1]["segment_ids"].max(axis=1) == 3).all()


def test_pack_documents():
  docs = [np.arange(1, 4), np.arange(10, 15), np.arange(20, 30)]
  out = datasets.pack_documents(docs, row_len=8)
  np.testing.assert_array_equal(out["tokens"], [[1, 2, 3, 10, 11, 12, 13, 14],
                                                [20, 21, 22, 23, 24, 25, 26, 27],
                                                [28, 29, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out["segment_ids"], [[1, 1, 1, 2, 2, 2, 2, 2],
                                                     [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out["positions"], [[0, 1, 2, 0, 1, 2, 3, 4],
                                                   list(range(8)), [0, 1, 0, 0, 0, 0, 0, 0]])


def test_mask_tokens_statistics():
  rng = np.random.default_rng(0)
  inputs = rng.integers(0, 1000, (400, 250)).astype(np.int32)
  maskable = np.ones(inputs.shape, bool)
  maskable[:, 200:] = False  # padding
  masked, targets, weights = mask_tokens(inputs, (0, 1), 1000, 1000, maskable)
  np.testing.assert_array_equal(targets, inputs)
  sel = weights > 0
  assert not sel[:, 200:].any()
  np.testing.assert_array_equal(masked[~sel], inputs[~sel])  # unselected never change
  assert abs(sel[:, :200].mean() - 0.15) < 0.005
  m = masked[sel]
  frac_mask = (m == 1000).mean()
  frac_kept = (m == inputs[sel]).mean()
  frac_random = 1 - frac_mask - frac_kept
  assert abs(frac_mask - 0.8) < 0.01 and abs(frac_kept - 0.1) < 0.01
  assert abs(frac_random - 0.1) < 0.01
  assert m.max() <= 1000 and m.min() >= 0
  # Row slicing: rows 10..19 masked alone equal the full batch's rows.
  part = mask_tokens(inputs[10:20], (0, 1), 1000, 1000, maskable[10:20], rows=np.arange(10, 20))
  np.testing.assert_array_equal(part[0], masked[10:20])


def test_mlm_dataset(corpus):
  ds = _text_dataset(corpus, task="mlm")
  assert ds.mask_id == ds.tokenizer.vocab_size and ds.vocab_size == ds.tokenizer.vocab_size + 1
  batch = ds.train_batch(0, 64)
  assert batch["inputs"].shape == (64, 32)
  assert abs(batch["weights"].mean() - 0.15) < 0.03
  assert (batch["inputs"] == ds.mask_id).any() and "[MASK]" in ds.decode(batch["inputs"][0:4])
  part = ds.train_batch(0, 64, row_start=8, row_count=8)
  np.testing.assert_array_equal(batch["inputs"][8:16], part["inputs"])
  packed = _text_dataset(corpus, task="mlm", mode="packed", seq_len=64)
  b = packed.train_batch(0, 64)
  assert not b["weights"][b["segment_ids"] == 0].any()  # padding never selected
  ev = ds.eval_batches(4, 2)
  np.testing.assert_array_equal(ev[0][1]["inputs"], ds.eval_batches(4, 2)[0][1]["inputs"])


def test_make_text_dataset_and_resume(tmp_path, corpus):
  path = _text_file(tmp_path, corpus)
  workdir = str(tmp_path / "run")
  ds = make_dataset(_config(name="text", path=path, seq_len=16), "lm", workdir)
  assert os.path.exists(os.path.join(workdir, tokenizers.TOKENIZER_FILE))
  assert ds.vocab_size == len(set(corpus))
  mlm = make_dataset(_config(name="text", path=path, seq_len=16), "mlm", workdir)
  assert mlm.vocab_size == ds.vocab_size + 1


def test_make_dataset_synthetic():
  ds = make_dataset(_config(name="reverse", form="seq2seq"), "seq2seq", None)
  assert "encoder_inputs" in ds.train_batch(0, 2)
  cls = make_dataset(_config(name="majority"), "classification", None)
  assert "labels" in cls.train_batch(0, 2)
  with pytest.raises(ValueError, match="serves task 'lm'"):
    make_dataset(_config(name="copy"), "seq2seq", None)


def test_config_errors(tmp_path):
  with pytest.raises(ValueError, match="tinyshakespeare"):
    make_dataset(_config(name="wikitext"), "lm", None)
  with pytest.raises(ValueError, match="classification"):
    make_dataset(_config(name="copy"), "translation", None)
  with pytest.raises(ValueError, match="'lm' and 'mlm'"):
    make_dataset(_config(name="text", path="x"), "seq2seq", None)
  with pytest.raises(ValueError, match="data_config.path"):
    make_dataset(_config(name="text", path=""), "lm", None)
  config = _config(name="copy")
  del config["form"]
  with pytest.raises(KeyError, match="form"):
    make_dataset(config, "lm", None)


def test_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    make_dataset(_config(name="text", path=str(tmp_path / "missing.txt")), "lm", None)
  empty = _text_file(tmp_path, "", "empty.txt")
  with pytest.raises(ValueError, match="empty.txt is empty"):
    make_dataset(_config(name="text", path=empty), "lm", None)
  short = _text_file(tmp_path, "a" * 100, "short.txt")
  # 100 chars: val split has 10 tokens, seq_len 16 needs 17.
  with pytest.raises(ValueError, match=r"short.txt.*val split has 10 tokens.*at least 17"):
    make_dataset(_config(name="text", path=short, seq_len=16), "lm", None)


def test_tinyshakespeare_offline_error(tmp_path, monkeypatch):
  monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "data"))
  monkeypatch.setenv(datasets.CACHE_DIR_ENV, str(tmp_path / "cache"))

  def offline(url, dest):
    raise OSError("network unreachable")

  monkeypatch.setattr(text_files, "_download", offline)
  with pytest.raises(FileNotFoundError) as info:
    make_dataset(_config(), "lm", None)
  message = str(info.value)
  assert datasets.DATA_DIR_ENV in message and "network unreachable" in message
  assert os.path.join(str(tmp_path / "data"), "tinyshakespeare", "input.txt") in message


def test_tinyshakespeare_downloads_into_cache(tmp_path, monkeypatch, corpus):
  monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
  monkeypatch.setenv(datasets.CACHE_DIR_ENV, str(tmp_path))
  calls = []

  def fake_download(url, dest):
    calls.append(url)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "w", encoding="utf-8") as f:
      f.write(corpus)

  monkeypatch.setattr(text_files, "_download", fake_download)
  assert datasets.tinyshakespeare_path() == str(tmp_path / "tinyshakespeare" / "input.txt")
  datasets.tinyshakespeare_path()
  assert calls == [datasets.TINYSHAKESPEARE_URL]  # cached after the first call


def test_tinyshakespeare_shared_file(monkeypatch, tmp_path):
  candidates = [SHARED_DATA, os.environ.get(datasets.DATA_DIR_ENV, "")]
  found = [d for d in candidates
           if d and os.path.exists(os.path.join(d, "tinyshakespeare", "input.txt"))]
  if not found:
    pytest.skip(f"Tiny Shakespeare not at {SHARED_DATA}/tinyshakespeare/input.txt nor under "
                f"${datasets.DATA_DIR_ENV}")
  monkeypatch.setenv(datasets.DATA_DIR_ENV, found[0])
  ds = make_dataset(_config(seq_len=256), "lm", str(tmp_path))
  assert len(ds.train_tokens) + len(ds.val_tokens) == 1_115_394
  assert ds.vocab_size == 65
  assert len(ds.train_tokens) == int(1_115_394 * 0.9)
  assert ds.decode(ds.train_tokens[:14]) == "First Citizen:"


@pytest.mark.parametrize("content,message", [("", "empty"), ("abc\n" * 5, "too short")])
def test_empty_or_short_text_file_is_a_clear_error(tmp_path, content, message):
  path = tmp_path / "tiny.txt"
  path.write_text(content)
  workdir = tmp_path / "run"
  result = run_cli([f"--workdir={workdir}", "--config.data.name=text",
                     f"--config.data.path={path}", "--config.data.seq_len=64"], cwd=tmp_path)
  assert result.returncode == 2
  assert message in result.stderr.lower() and str(path) in result.stderr, result.stderr[-2000:]
  assert not workdir.exists()


def test_a_failed_download_leaves_nothing_in_home(tmp_path, monkeypatch):
  """Without $TFJAX_CACHE_DIR the cache is ~/.cache/tfjax; a download that fails (offline) must
  not leave an empty ~/.cache/tfjax/tinyshakespeare/ behind (what the suite used to leave)."""
  home = tmp_path / "home"
  home.mkdir()
  monkeypatch.setenv("HOME", str(home))
  monkeypatch.delenv(datasets.CACHE_DIR_ENV, raising=False)
  monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "no-data"))

  def offline(url, timeout):
    raise OSError("network unreachable")

  monkeypatch.setattr(text_files.urllib.request, "urlopen", offline)
  with pytest.raises(FileNotFoundError, match="network unreachable"):
    datasets.tinyshakespeare_path()
  assert list(home.iterdir()) == []


def test_the_suite_cache_dir_is_under_the_tmp_folder(cache_dir_under_tmp, tmp_path):
  """tests/conftest.py points $TFJAX_CACHE_DIR at pytest's tmp folder for the whole session."""
  assert datasets.cache_dir() == cache_dir_under_tmp
  # Both sit in the session's base tmp folder.
  assert os.path.dirname(cache_dir_under_tmp) == os.path.dirname(str(tmp_path))
  assert not cache_dir_under_tmp.startswith(os.path.join(os.path.expanduser("~"), ".cache"))
