"""tfjax/data/prepare.py (tfjax-prepare): shards, manifest, determinism, resume and bad input.

The references are independent of tfjax: documents generated here, bytes encoded
with str.encode, BPE ids from `tokenizers` directly, checksums with hashlib."""

import gzip
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.data import manifest as mf
from tfjax.data import prepare as prep
from tfjax.data import shard_writer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(*args, **kwargs):
  """prep.prepare without the val split's minimum size (the corpora here are a few hundred
  tokens) unless a test asks for one."""
  return prep.prepare(*args, **{"min_val_tokens": 0, **kwargs})


def corpus_docs(n=60, seed=0):
  rng = np.random.default_rng(seed)
  words = ["the", "cat", "sat", "on", "a", "mat", "über", "naïve", "café", "日本"]
  return [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) + f" #{i}" for i in range(n)]


def write_corpus(tmp_path, docs):
  """Half the documents as .txt paragraphs, half as .jsonl.gz lines (plus an extra key)."""
  half = len(docs) // 2
  (tmp_path / "a.txt").write_text("\n\n\n".join(docs[:half]) + "\n", encoding="utf-8")
  with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
    for d in docs[half:]:
      f.write(json.dumps({"id": 1, "text": d}) + "\n")
  return f"{tmp_path}/a.txt,{tmp_path}/b.jsonl.gz"


def load(directory, split):
  m = mf.read_manifest(str(directory))
  tokens = [np.load(os.path.join(directory, s["tokens"])) for s in m["splits"][split]["shards"]]
  ends = [np.load(os.path.join(directory, s["docs"])) for s in m["splits"][split]["shards"]]
  docs = []
  for t, e in zip(tokens, ends):
    docs += [t[a:b] for a, b in zip(np.concatenate([[0], e[:-1]]).astype(int), e.astype(int))]
  return m, docs


def tree_bytes(directory):
  return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))}


def test_byte_prepare_holds_every_document_in_order(tmp_path):
  docs = corpus_docs()
  inputs = write_corpus(tmp_path, docs)
  out = tmp_path / "out"
  m = prepare(inputs, "byte", str(out), val_docs=5, shard_mb=0.0005, workers=1,
                   progress=False)
  assert sorted(os.listdir(out)) == sorted(
      ["manifest.json", "tokenizer.json"] + [s[k] for sp in mf.SPLITS
                                             for s in m["splits"][sp]["shards"]
                                             for k in ("tokens", "docs")])
  _, val = load(out, "val")
  _, train = load(out, "train")
  assert len(m["splits"]["train"]["shards"]) > 1 and m["dtype"] == "uint16"
  got = [bytes(d.astype(np.uint8)).decode("utf-8") for d in val + train]
  assert got == docs  # first 5 documents are val, the rest train, in order, nothing lost
  assert m["num_docs"] == len(docs) and m["splits"]["val"]["num_docs"] == 5
  for shard in m["splits"]["train"]["shards"]:
    digest = hashlib.sha256()
    for name in (shard["tokens"], shard["docs"]):
      digest.update(hashlib.sha256((out / name).read_bytes()).hexdigest().encode())
    assert shard["sha256"] == digest.hexdigest()
  assert [s["bytes"] for s in m["sources"]] == [os.path.getsize(tmp_path / n)
                                                for n in ("a.txt", "b.jsonl.gz")]
  assert m["tokenizer"]["name"] == "byte" and m["tokenizer"]["vocab_size"] == 256


def test_hf_tokenizer_ids_and_end_of_text(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  docs = corpus_docs(40)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<eot>"], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  tok_dir = tmp_path / "tok"
  tok_dir.mkdir()
  tok.save(str(tok_dir / "tokenizer.json"))
  (tok_dir / "tokenizer_config.json").write_text('{"eos_token": "<eot>"}')
  (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
  out = tmp_path / "out"
  m = prepare(str(tmp_path / "c.jsonl"), f"hf:{tok_dir}", str(out), text_field="body",
                   val_fraction=0.2, workers=1, progress=False)
  eot = tok.token_to_id("<eot>")
  assert m["tokenizer"]["eos_id"] == eot
  _, val = load(out, "val")
  _, train = load(out, "train")
  assert len(val) + len(train) == len(docs) and 0 < len(val) < len(docs)
  expected = {tuple(tok.encode(d).ids + [eot]) for d in docs}
  assert {tuple(d.tolist()) for d in val + train} == expected


def test_workers_and_a_killed_prepare_give_byte_identical_shards(tmp_path, monkeypatch):
  inputs = write_corpus(tmp_path, corpus_docs(80))
  kwargs = dict(val_fraction=0.1, shard_mb=0.0005, progress=False)
  prepare(inputs, "byte", str(tmp_path / "one"), workers=1, **kwargs)
  prepare(inputs, "byte", str(tmp_path / "two"), workers=2, **kwargs)
  reference = tree_bytes(tmp_path / "one")
  assert len(reference) > 8 and tree_bytes(tmp_path / "two") == reference

  written = []
  real = shard_writer.write_shard

  def dies_on_the_fourth_shard(*args):
    if len(written) == 3:
      raise KeyboardInterrupt  # as a kill would stop it: mid-run, after 3 finished shards
    written.append(args[1:3])
    return real(*args)

  monkeypatch.setattr(shard_writer, "write_shard", dies_on_the_fourth_shard)
  killed = tmp_path / "killed"
  with pytest.raises(KeyboardInterrupt):
    prepare(inputs, "byte", str(killed), workers=1, **kwargs)
  assert not (killed / "manifest.json").exists()  # nothing presented as complete
  with pytest.raises(ValueError, match="no manifest.json"):
    mf.read_manifest(str(killed))
  # A shard whose files were written but not its sidecar counts as unfinished and is redone.
  (killed / mf.tokens_file("train", 3)).write_bytes(b"half a shard")
  (killed / (mf.tokens_file("train", 4) + ".tmp123.npy")).write_bytes(b"killed mid-write")
  monkeypatch.setattr(shard_writer, "write_shard", real)
  calls = []
  monkeypatch.setattr(shard_writer, "write_shard", lambda *a: calls.append(a[1:3]) or real(*a))
  prepare(inputs, "byte", str(killed), workers=1, **kwargs)
  assert not set(calls) & set(written)  # finished shards were kept, not tokenized again
  assert tree_bytes(killed) == reference


@pytest.mark.parametrize("policy, count, kept", [("replace", 1, 3), ("skip", 1, 2)])
def test_non_utf8_bytes_are_counted(tmp_path, policy, count, kept):
  (tmp_path / "c.txt").write_bytes(b"good one\n\nbad \xff\xfe here\n\nfine too\n")
  m = prepare(str(tmp_path / "c.txt"), "byte", str(tmp_path / "o"), val_docs=1,
                   workers=1, bad_utf8=policy, progress=False)
  assert m["bad_utf8"] == {"policy": policy, "documents": count}
  _, train = load(tmp_path / "o", "train")
  assert m["num_docs"] == kept and len(train) == kept - 1
  if policy == "replace":
    assert bytes(train[0].astype(np.uint8)).decode() == "bad \ufffd\ufffd here"


def test_token_dtype():
  assert mf.token_dtype(65536) == np.uint16 and mf.token_dtype(65537) == np.uint32
  assert mf.token_dtype(256, "uint32") == np.uint32
  with pytest.raises(ValueError, match="uint16 holds ids up to 65,535.*--dtype=uint32"):
    mf.token_dtype(100_000, "uint16")


def _error(tmp_path, *args, **kwargs):
  with pytest.raises((ValueError, FileNotFoundError)) as info:
    prepare(*args, workers=1, progress=False, **kwargs)
  return str(info.value)


def test_bad_input_is_one_clear_error(tmp_path, monkeypatch):
  out = str(tmp_path / "out")
  assert "no such file" in _error(tmp_path, str(tmp_path / "nope.txt"), "byte", out)
  assert "matches no file" in _error(tmp_path, str(tmp_path / "*.jsonl"), "byte", out)
  (tmp_path / "empty.txt").write_text("\n\n")
  assert "the inputs are empty" in _error(tmp_path, str(tmp_path / "empty.txt"), "byte", out,
                                          val_docs=1)
  (tmp_path / "x.jsonl").write_text('{"text": "a"}\n{"content": "b"}\n')
  message = _error(tmp_path, str(tmp_path / "x.jsonl"), "byte", str(tmp_path / "o2"))
  assert "x.jsonl:2: no 'text' field (it has ['content'])" in message and "--text_field" in message
  (tmp_path / "bad.txt").write_bytes(b"\xff\n")
  assert "--bad_utf8=replace" in _error(tmp_path, str(tmp_path / "bad.txt"), "byte",
                                        str(tmp_path / "o3"), bad_utf8="error")
  (tmp_path / "x.csv").write_text("a")
  assert "unknown file type" in _error(tmp_path, str(tmp_path / "x.csv"), "byte", out)
  monkeypatch.delenv("TFJAX_GPT2_TOKENIZER", raising=False)
  monkeypatch.setenv("HF_HOME", str(tmp_path / "no_hf"))
  message = _error(tmp_path, str(tmp_path / "x.jsonl"), "gpt2", str(tmp_path / "o4"))
  assert "tokenizer.json on disk" in message and "--tokenizer=hf:DIR" in message
  assert "choose one of" in _error(tmp_path, str(tmp_path / "x.jsonl"), "wordpiece", out)


def test_finished_and_foreign_outputs_are_never_overwritten(tmp_path):
  (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n")
  out = tmp_path / "out"
  prepare(str(tmp_path / "c.txt"), "byte", str(out), val_docs=1, workers=1, progress=False)
  before = tree_bytes(out)
  assert "already holds a finished prepare" in _error(tmp_path, str(tmp_path / "c.txt"), "byte",
                                                      str(out), val_docs=1)
  assert tree_bytes(out) == before
  (tmp_path / "partial").mkdir()
  (tmp_path / "partial" / prep.PLAN).write_text("{}")
  assert "unfinished prepare of other inputs" in _error(
      tmp_path, str(tmp_path / "c.txt"), "byte", str(tmp_path / "partial"), val_docs=1)


def test_cli_prints_one_error_line_and_exits_2(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "tfjax.data.prepare", f"--input={tmp_path}/missing.jsonl",
       "--tokenizer=byte", f"--output={tmp_path}/out"], capture_output=True, text=True,
      cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: --input='{tmp_path}/missing.jsonl': no such file or directory"]
  assert not (tmp_path / "out").exists()
  result = subprocess.run(
      [sys.executable, "-m", "tfjax.data.prepare", "--input=a.txt", "--tokenizer=byte",
       f"--output={tmp_path}/out", "--append_eos=maybe"], capture_output=True, text=True,
      cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
  assert result.returncode == 2 and result.stderr.strip().splitlines() == [
      "error: argument --append_eos: 'maybe' is not a boolean (true or false) (see tfjax-prepare "
      "--help)"]
  result = subprocess.run([sys.executable, "-m", "tfjax.data.prepare", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env=dict(os.environ, PYTHONPATH=REPO))
  flag_lines = [l.strip() for l in result.stdout.splitlines() if l.strip().startswith("--")]
  for flag in ("--input", "--tokenizer", "--output", "--workers", "--val_fraction", "--bad_utf8",
               "--min_val_tokens", "--overwrite"):
    assert len([l for l in flag_lines if l.startswith(flag + " ")]) == 1, result.stdout


def _prepared_texts(tmp_path, inputs, **kwargs):
  prepare(inputs, "byte", str(tmp_path / "o"), val_docs=2, workers=1, progress=False, **kwargs)
  _, val = load(tmp_path / "o", "val")
  _, train = load(tmp_path / "o", "train")
  return [bytes(d.astype(np.uint8)).decode() for d in val + train]


def test_parquet_and_zstd_jsonl_inputs(tmp_path):
  pa = pytest.importorskip("pyarrow")
  zstandard = pytest.importorskip("zstandard")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  docs = corpus_docs(20)
  pq.write_table(pa.table({"body": docs[:10]}), tmp_path / "a.parquet")
  lines = "".join(json.dumps({"body": d}) + "\n" for d in docs[10:]).encode()
  (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
  assert _prepared_texts(tmp_path, f"{tmp_path}/a.parquet,{tmp_path}/b.jsonl.zst",
                         text_field="body") == docs


def test_save_to_disk_input(tmp_path):
  datasets = pytest.importorskip("datasets")
  docs = corpus_docs(20)
  datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "ds"))
  assert _prepared_texts(tmp_path, str(tmp_path / "ds")) == docs


@pytest.mark.slow  # ~8 s on 2 shared cores; the in-process kill above runs by default
def test_a_sigkilled_prepare_with_workers_resumes_byte_identical(tmp_path):
  """A real kill -9 of the prepare and its worker processes, mid-run, then the same command."""
  import signal  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  with open(tmp_path / "c.jsonl", "w") as f:
    for i in range(4000):
      f.write(json.dumps({"text": "".join(rng.choice(list("abcdefgh "), 1500)) + str(i)}) + "\n")
  command = [sys.executable, "-m", "tfjax.data.prepare", f"--input={tmp_path}/c.jsonl",
             "--tokenizer=byte", "--val_docs=10", "--shard_mb=0.03", "--workers=2",
             "--progress=false"]
  env = dict(os.environ, PYTHONPATH=REPO)
  subprocess.run(command + [f"--output={tmp_path}/straight"], check=True, env=env, cwd=REPO,
                 capture_output=True, timeout=120)
  killed = tmp_path / "killed"
  process = subprocess.Popen(command + [f"--output={killed}"], env=env, cwd=REPO,
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  deadline = time.time() + 60
  while not (killed / shard_writer.sidecar_file("train", 20)).exists():
    assert time.time() < deadline and process.poll() is None
    time.sleep(0.005)
  os.killpg(process.pid, signal.SIGKILL)
  process.wait()
  assert not (killed / "manifest.json").exists()  # killed mid-run: nothing presented as complete
  subprocess.run(command + [f"--output={killed}"], check=True, env=env, cwd=REPO,
                 capture_output=True, timeout=120)
  assert tree_bytes(killed) == tree_bytes(tmp_path / "straight")


def test_gpt2_tokenizer_from_the_hf_cache_or_the_environment(tmp_path, monkeypatch):
  """A stand-in with GPT-2's shape (50,257 ids, <|endoftext|> = 50256; the real merges are not
  needed to find and check the file)."""
  tokenizers = pytest.importorskip("tokenizers")
  from tfjax.data import tokenizer_spec  # pylint: disable=import-outside-toplevel
  alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
  vocab = {c: i for i, c in enumerate(sorted(alphabet))}
  vocab.update({f"filler{i}": i for i in range(len(vocab), 50256)})
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.add_special_tokens(["<|endoftext|>"])
  snapshot = tmp_path / "hf" / "hub" / "models--gpt2" / "snapshots" / "abc"
  snapshot.mkdir(parents=True)
  tok.save(str(snapshot / "tokenizer.json"))
  monkeypatch.delenv("TFJAX_GPT2_TOKENIZER", raising=False)
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
  spec = tokenizer_spec.resolve("gpt2")
  assert (spec.name, spec.vocab_size, spec.eos_id) == ("gpt2", 50257, 50256)
  assert mf.token_dtype(spec.vocab_size) == np.uint16
  (tmp_path / "c.txt").write_text("hello there\n\nsecond doc\n")
  m = prepare(str(tmp_path / "c.txt"), "gpt2", str(tmp_path / "o"), val_docs=1, workers=1,
                   progress=False)
  _, train = load(tmp_path / "o", "train")
  assert train[0].tolist() == tok.encode("second doc").ids + [50256]
  assert m["tokenizer"]["name"] == "gpt2" and m["dtype"] == "uint16"
  small = tmp_path / "small"
  small.mkdir()
  tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"a": 0}, merges=[])).save(
      str(small / "tokenizer.json"))
  monkeypatch.setenv("TFJAX_GPT2_TOKENIZER", str(small))  # the environment comes first
  with pytest.raises(ValueError, match="is not GPT-2's tokenizer \\(1 ids"):
    tokenizer_spec.resolve("gpt2")


def test_an_unfinished_prepare_refuses_inputs_changed_since(tmp_path, monkeypatch):
  (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n")

  def killed(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(shard_writer, "write_shard", killed)
  with pytest.raises(KeyboardInterrupt):
    prepare(str(tmp_path / "c.txt"), "byte", str(tmp_path / "out"), val_docs=1, workers=1,
                 progress=False)
  monkeypatch.undo()
  (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n\nfour\n")  # the corpus grew meanwhile
  assert "unfinished prepare of other inputs or flags (or inputs that changed since" in _error(
      tmp_path, str(tmp_path / "c.txt"), "byte", str(tmp_path / "out"), val_docs=1)


def _paragraphs(tmp_path, n=600, name="c.txt"):
  """n short paragraphs (a small corpus like Tiny Shakespeare: thousands of tokens, many docs)."""
  rng = np.random.default_rng(3)
  docs = ["".join(rng.choice(list("abcdefgh "), size=int(rng.integers(20, 60)))).strip() + "."
          for _ in range(n)]
  (tmp_path / name).write_text("\n\n".join(docs) + "\n", encoding="utf-8")
  return str(tmp_path / name), docs


def test_a_small_corpus_gets_a_val_split_of_at_least_min_val_tokens(tmp_path):
  """The default --val_fraction (0.0005) picks almost no document of a small corpus; the leading
  documents holding --min_val_tokens tokens join the val split, so evaluation at that length
  works."""
  path, docs = _paragraphs(tmp_path)
  tokens = [len(d.encode()) for d in docs]  # byte ids (the byte tokenizer has no end of text)
  bare = prep.prepare(path, "byte", str(tmp_path / "bare"), workers=1, progress=False,
                      min_val_tokens=0)
  assert bare["splits"]["val"]["num_tokens"] < 200  # the issue: a split of a few dozen tokens
  m = prep.prepare(path, "byte", str(tmp_path / "o"), workers=1, progress=False,
                   min_val_tokens=2000)
  k = int(np.searchsorted(np.cumsum(tokens), 2000))  # the fewest leading docs with >= 2000
  assert sum(tokens[:k]) < 2000 <= sum(tokens[:k + 1])
  assert m["settings"]["val_leading_docs"] == k + 1
  _, val = load(tmp_path / "o", "val")
  _, train = load(tmp_path / "o", "train")
  texts = lambda split: [bytes(d.astype(np.uint8)).decode() for d in split]  # noqa: E731
  assert texts(val)[:k + 1] == docs[:k + 1]  # the leading documents, in order
  assert sorted(texts(val) + texts(train)) == sorted(docs)  # every document once
  assert m["splits"]["val"]["num_tokens"] >= 2000
  # ... and those the hash picks, as without the minimum.
  hashed = set(texts(load(tmp_path / "bare", "val")[1]))
  assert set(texts(val)[k + 1:]) == hashed - set(docs[:k + 1])
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  config = datasets.default_data_config()
  config.update(name="prepared", path=str(tmp_path / "bare"), seq_len=64)
  with pytest.raises(ValueError, match=r"no val shard holds 65 tokens.*again with "
                     r"--min_val_tokens=520 --overwrite"):
    datasets.make_dataset(config, "lm").eval_batches(4, 1)
  config.update(path=str(tmp_path / "o"))
  [(_, batch)] = datasets.make_dataset(config, "lm").eval_batches(4, 1)
  assert batch["inputs"].shape == (4, 64)


def test_too_small_a_corpus_or_too_few_val_docs_is_one_clear_error_before_writing(tmp_path):
  path, _ = _paragraphs(tmp_path, n=20)
  out = tmp_path / "o"
  message = _error(tmp_path, path, "byte", str(out), min_val_tokens=8200)
  assert "too small for a validation split of --min_val_tokens=8,200 tokens" in message
  assert "lower --min_val_tokens" in message and not out.exists()
  path, docs = _paragraphs(tmp_path, n=600, name="big.txt")
  message = _error(tmp_path, path, "byte", str(out), val_docs=3, min_val_tokens=2000)
  k = int(np.searchsorted(np.cumsum([len(d.encode()) for d in docs]), 2000)) + 1
  assert f"--val_docs=3: those documents hold fewer than --min_val_tokens=2,000" in message
  assert f"use --val_docs={k} or more" in message and not out.exists()
  assert "--min_val_tokens=-1" in _error(tmp_path, path, "byte", str(out), min_val_tokens=-1)


def test_overwrite_replaces_an_earlier_prepare_only_when_asked_and_loses_nothing_on_failure(
    tmp_path, monkeypatch):
  (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n\nfour\n")
  out = tmp_path / "out"
  prepare(str(tmp_path / "c.txt"), "byte", str(out), val_docs=1, workers=1, progress=False)
  before = tree_bytes(out)
  message = _error(tmp_path, str(tmp_path / "c.txt"), "byte", str(out), val_docs=2)
  assert "already holds a finished prepare" in message and "--overwrite" in message
  assert tree_bytes(out) == before

  real = shard_writer.write_shard

  def fails(*args):
    raise OSError("disk full")

  monkeypatch.setattr(shard_writer, "write_shard", fails)
  with pytest.raises(OSError, match="disk full"):
    prepare(str(tmp_path / "c.txt"), "byte", str(out), val_docs=2, workers=1, progress=False,
            overwrite=True)
  assert tree_bytes(out) == before  # the failed replacement touched nothing of the earlier one
  monkeypatch.setattr(shard_writer, "write_shard", real)
  m = prepare(str(tmp_path / "c.txt"), "byte", str(out), val_docs=2, workers=1, progress=False,
              overwrite=True)
  assert m["settings"]["val_docs"] == 2 and mf.read_manifest(str(out)) == m
  assert [bytes(d.astype(np.uint8)) for d in load(out, "val")[1]] == [b"one", b"two"]
  assert sorted(os.listdir(tmp_path)) == ["c.txt", "out"]  # no staging folder left behind
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("not a prepare")
  message = _error(tmp_path, str(tmp_path / "c.txt"), "byte", str(tmp_path / "mine"),
                   val_docs=1, overwrite=True)
  assert "holds no prepare" in message and (tmp_path / "mine" / "notes.txt").exists()


def test_cli_overwrite_flag(tmp_path):
  (tmp_path / "c.txt").write_text("one\n\ntwo\n\nthree\n")
  command = [sys.executable, "-m", "tfjax.data.prepare", f"--input={tmp_path}/c.txt",
             "--tokenizer=byte", f"--output={tmp_path}/out", "--val_docs=1",
             "--min_val_tokens=0", "--progress=false", "--workers=1"]
  env = dict(os.environ, PYTHONPATH=REPO)

  def run(*extra):
    return subprocess.run(command + list(extra), capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=60)

  assert run().returncode == 0
  again = run()
  assert again.returncode == 2 and "--overwrite" in again.stderr.strip().splitlines()[-1]
  assert run("--overwrite").returncode == 0
