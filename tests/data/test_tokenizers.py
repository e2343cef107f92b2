"""tfjax/data/tokenizers.py: byte, char and BPE tokenizers round trip and save/load."""

import sys

import numpy as np
import pytest

from test_data import SAMPLE, _paragraph_text
from tfjax.data import tokenizers


def test_byte_tokenizer_roundtrip():
  tok = tokenizers.ByteTokenizer()
  ids = tok.encode(SAMPLE)
  assert ids.dtype == np.int32 and tok.vocab_size == 256
  assert len(ids) == len(SAMPLE.encode("utf-8"))
  assert tok.decode(ids) == SAMPLE


def test_char_tokenizer_roundtrip_save_load(tmp_path):
  tok = tokenizers.make_tokenizer("char", SAMPLE, str(tmp_path))
  assert tok.vocab_size == len(set(SAMPLE)) and tok.chars == "".join(sorted(set(SAMPLE)))
  ids = tok.encode(SAMPLE)
  assert ids.dtype == np.int32 and tok.decode(ids) == SAMPLE
  # A resumed run loads the saved vocabulary, whatever corpus it is handed now.
  again = tokenizers.make_tokenizer("char", "completely different", str(tmp_path))
  assert again.chars == tok.chars
  assert tokenizers.CharTokenizer.load(str(tmp_path)).chars == tok.chars
  with pytest.raises(ValueError, match="not in the vocabulary"):
    tok.encode("xyz€")
  with pytest.raises(ValueError, match="holds a 'char' tokenizer"):
    tokenizers.make_tokenizer("byte", SAMPLE, str(tmp_path))


def test_bpe_tokenizer_roundtrip_save_load(tmp_path):
  pytest.importorskip("tokenizers")
  corpus = _paragraph_text(200) + SAMPLE
  tok = tokenizers.make_tokenizer("bpe", corpus, str(tmp_path), bpe_vocab_size=300)
  assert 256 < tok.vocab_size <= 300
  ids = tok.encode(corpus)
  assert ids.dtype == np.int32 and len(ids) < len(corpus.encode("utf-8"))
  assert tok.decode(ids) == corpus
  unseen = "unseen text: ∑ 😀"
  assert tok.decode(tok.encode(unseen)) == unseen  # byte-level: no unknown tokens
  loaded = tokenizers.load_tokenizer(str(tmp_path))
  np.testing.assert_array_equal(loaded.encode(corpus), ids)
  with pytest.raises(ValueError, match="vocab size 300"):
    tokenizers.make_tokenizer("bpe", corpus, str(tmp_path), bpe_vocab_size=512)


def test_bpe_missing_package_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
  with pytest.raises(ImportError, match=r"tfjax\[bpe\]"):
    tokenizers.make_tokenizer("bpe", SAMPLE, None)


def test_unknown_tokenizer():
  with pytest.raises(ValueError, match="byte.*char"):
    tokenizers.make_tokenizer("wordpiece", SAMPLE, None)
