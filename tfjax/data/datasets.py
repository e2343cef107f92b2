"""Datasets as batches of NumPy arrays: text LM / masked LM and the synthetic tasks.

`make_dataset(data_config, task, workdir)` picks the dataset by `data_config.name`; start the config
from `default_data_config()`, which lists every key with its meaning.

Multi-host contract: every dataset has
  train_batch(index, batch_size, row_start=0, row_count=None) -> dict of arrays
where row r of global batch `index` is a pure function of (seed, index, r). Process p of P builds
only its rows (row_start=p*B/P, row_count=B/P) and the global batch is identical whatever P is;
resuming needs only the batch index (`DataIterator.state()`). `eval_batches(...)` is deterministic
(a fixed eval seed, independent of the training seed, so every run is evaluated on the same data)
and returns [(group_name, batch)]; metrics are averaged over the batches that share a name.

Text batches (all int32 except float32 `weights`; weights 1 = counts in the loss):
  lm,  mode='random': inputs [B,L], targets [B,L], weights [B,L]. Each row is a random window of
       L+1 tokens w of the split (nanoGPT): inputs = w[:-1], targets = w[1:].
  lm,  mode='packed': the same plus segment_ids [B,L] (1, 2, ... per document, 0 = padding) and
       positions [B,L] (0-based within each document). Targets never cross a document: weight 0 at
       each document's last token and on padding.
  mlm: inputs [B,L] (BERT-masked), targets [B,L] (original tokens), weights [B,L] (1 at the ~15%
       selected positions); plus segment_ids and positions in packed mode. The [MASK] token is
       one extra id appended after the tokenizer's: mask_id = tokenizer.vocab_size, and the
       dataset's vocab_size = tokenizer.vocab_size + 1 (size the model's embedding by it).
Synthetic batches: see tfjax.data.synthetic.

Randomness for text comes from a counter-based hash of (seed, stream, index, row[, position])
(tfjax.data.hashed_rng),
vectorized over the batch, so building a 64 x 257 batch costs well under a millisecond.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

import ml_collections

from tfjax.data import manifest, prepared, synthetic
# Re-exported so that `datasets.<name>` reaches the whole dataset layer from one module.
from tfjax.data.hashed_rng import _randint, _uniform, hash_bits, mask_tokens  # noqa: F401
from tfjax.data.packing import _packed_lm_targets, pack_documents  # noqa: F401
from tfjax.data.text_dataset import (_TRAIN, DOC_SPLITS, EVAL_MODES, MODES,  # noqa: F401
                                     TextDataset, text_vocab_size)
from tfjax.data.text_files import (CACHE_DIR_ENV, DATA_DIR_ENV,  # noqa: F401
                                   TINYSHAKESPEARE_URL, cache_dir, read_text, split_text,
                                   tinyshakespeare_path)
from tfjax.data.tokenizers import TOKENIZER_FILE, ByteTokenizer, load_tokenizer, make_tokenizer
from tfjax.nn.choices import one_of

TEXT_DATASETS = ("tinyshakespeare", "text")
PREPARED = "prepared"  # a directory written by tfjax-prepare (tfjax.data.prepared)
DATASETS = TEXT_DATASETS + (PREPARED,) + tuple(synthetic.TASKS)


def default_data_config() -> ml_collections.ConfigDict:
  """Every data key with its default. make_dataset reads them without defaults (a missing key is
  an error), so build configs from this."""
  c = ml_collections.ConfigDict()
  c.name = "tinyshakespeare"  # one of DATASETS: 'tinyshakespeare', 'text', 'prepared' or synthetic
  c.path = ""  # name='text': the UTF-8 text file to read; name='prepared': the prepared directory
  # name='prepared' (its tokenizer and splits come from the directory's manifest).
  c.expect_tokenizer = ""  # '' = the manifest's; else its name ('gpt2') or a sha256 prefix
  c.verify = "checksum"  # every shard's sha256 at start-up | 'size' (sizes only: huge corpora)
  # Text datasets.
  c.tokenizer = "char"  # 'byte' (256 ids) | 'char' (corpus chars) | 'bpe' (needs `tokenizers`)
  c.bpe_vocab_size = 1024  # tokenizer='bpe': target vocabulary size (>= 256)
  c.seq_len = 256  # tokens per row (L); random LM windows take L+1 tokens
  c.val_fraction = 0.1  # last fraction of the text (in characters) is the validation split
  c.mode = "random"  # 'random' windows (nanoGPT) | 'packed' documents with segment_ids
  c.doc_split = "blank_lines"  # packed: documents = paragraphs split on blank lines | 'chunks'
  c.doc_chunk_tokens = 128  # packed with doc_split='chunks': tokens per document
  c.eval_mode = "random"  # text eval: 'random' windows (eval_seed) | 'sequential' (whole split)
  c.mlm_prob = 0.15  # task='mlm': fraction selected (then 80% [MASK], 10% random, 10% kept)
  # All datasets.
  c.seed = 0  # training stream: row r of batch i depends only on (seed, i, r)
  c.eval_seed = 1234  # evaluation data; keep fixed so different runs see the same eval set
  # Synthetic tasks (copy, reverse, sort, addition, associative_recall, majority, listops).
  c.train_lengths = (1, 16)  # inclusive (min, max) task length for training rows
  c.test_lengths = (8, 16, 24, 32)  # one eval group 'len_<n>' per length
  c.form = "decoder"  # 'decoder' (task='lm') | 'seq2seq' (task='seq2seq'); majority: classification
  c.num_symbols = 16  # alphabet size of copy/reverse/sort/associative_recall/majority
  return c


def _require(cfg, key: str):
  try:
    return cfg[key] if isinstance(cfg, Mapping) else getattr(cfg, key)
  except (AttributeError, KeyError):
    raise KeyError(f"data config has no key {key!r}; build it from "
                   "tfjax.data.datasets.default_data_config()") from None


# --- iteration ---------------------------------------------------------------------------------


class DataIterator:
  """Walks a dataset's training batches in order; its state is just the next batch index.

  `state()` is JSON-able and the same on every process (row_start / row_count only pick this
  process's rows), so one saved state restores a run on any number of processes.
  """

  def __init__(self, dataset, batch_size: int, start_index: int = 0, row_start: int = 0,
               row_count: Optional[int] = None):
    self.dataset, self.batch_size = dataset, batch_size
    self.index, self.row_start, self.row_count = int(start_index), row_start, row_count

  def next(self) -> dict:
    batch = self.dataset.train_batch(self.index, self.batch_size, self.row_start, self.row_count)
    self.index += 1
    return batch

  __next__ = next

  def __iter__(self):
    return self

  def state(self) -> dict:
    return {"index": self.index}

  def restore(self, state: dict) -> None:
    self.index = int(state["index"])


# --- registry ----------------------------------------------------------------------------------


def make_dataset(data_config, task: str, workdir: Optional[str] = None):
  """The dataset `data_config.name` for `task` (one of tfjax.training.tasks.TASKS).

  Text datasets ('tinyshakespeare', 'text') serve 'lm' and 'mlm'; their tokenizer is saved in /
  loaded from `workdir` (None: not saved). 'prepared' (tfjax.data.prepared) serves the same
  tasks from a tfjax-prepare directory, whose tokenizer must be the one `workdir` holds, if any.
  Synthetic sequence tasks serve 'lm' with
  form='decoder' and 'seq2seq' with form='seq2seq'; 'majority' and 'listops' serve
  'classification'.
  """
  name = _require(data_config, "name")
  one_of("data.name", name, DATASETS)
  get = lambda key: _require(data_config, key)  # noqa: E731
  if name not in ("text", PREPARED) and data_config.get("path"):  # it would be ignored
    raise ValueError(f"data.path={data_config.path!r} is read only by data.name='text' (a file) "
                     f"and 'prepared' (a directory), but data.name={name!r}; add "
                     "--config.data.name=text (or prepared) to train on it, or drop data.path")
  if name == PREPARED:
    if not get("path"):
      raise ValueError("dataset 'prepared' needs data.path: the directory tfjax-prepare wrote")
    return prepared.PreparedDataset(
        get("path"), task=task, seq_len=get("seq_len"), mode=get("mode"),
        eval_mode=get("eval_mode"), mlm_prob=get("mlm_prob"), seed=get("seed"),
        eval_seed=get("eval_seed"), verify=get("verify"),
        expect_tokenizer=get("expect_tokenizer"), run_dir=workdir)
  if name in TEXT_DATASETS:
    if task not in ("lm", "mlm"):
      raise ValueError(f"dataset {name!r} serves tasks 'lm' and 'mlm', not {task!r}")
    if name == "tinyshakespeare":
      path = tinyshakespeare_path()
    else:
      path = get("path")
      if not path:
        raise ValueError("dataset 'text' needs data_config.path: the text file to read")
    text = read_text(path)
    # The char vocabulary must cover the val split too; BPE is trained on the train split only.
    corpus = text if get("tokenizer") == "char" else split_text(text, get("val_fraction"))[0]
    tokenizer = make_tokenizer(get("tokenizer"), corpus, workdir,
                               bpe_vocab_size=get("bpe_vocab_size"))
    return TextDataset(text, tokenizer, source=path, task=task, seq_len=get("seq_len"),
                       val_fraction=get("val_fraction"), mode=get("mode"),
                       doc_split=get("doc_split"), doc_chunk_tokens=get("doc_chunk_tokens"),
                       eval_mode=get("eval_mode"), mlm_prob=get("mlm_prob"), seed=get("seed"),
                       eval_seed=get("eval_seed"))
  # data.form is ignored by majority and listops, which have only the classification layout.
  form = "classification" if synthetic.TASKS[name].is_classification else get("form")
  one_of("data.form", form, synthetic.FORMS + ("classification",))
  expected = {"decoder": "lm", "seq2seq": "seq2seq", "classification": "classification"}[form]
  if task != expected:
    raise ValueError(f"synthetic task {name!r} with form {form!r} serves task {expected!r}, not "
                     f"{task!r} (decoder -> 'lm', seq2seq -> 'seq2seq', majority / listops -> "
                     "'classification')")
  return synthetic.SyntheticDataset(
      name, form=form, train_lengths=tuple(get("train_lengths")),
      test_lengths=tuple(get("test_lengths")), num_symbols=get("num_symbols"),
      seed=get("seed"), eval_seed=get("eval_seed"))


def resolve_vocab_size(config, dataset=None, *, workdir: Optional[str] = None,
                       unknown: Optional[int] = None) -> int:
  """config.model.vocab_size, where 0 (or None) means the data's vocabulary. The one place that
  resolves vocab_size=0 (training, reading a run back, parameter accounting, sweeps).

  The data's vocabulary is `dataset.vocab_size` when the dataset is built; else, without building
  it, a synthetic task's, the tokenizer saved in `workdir`'s, or the byte tokenizer's. A char or
  BPE vocabulary not yet saved is known only once its corpus is read: then `unknown` if given (a
  stand-in for checks that need only a valid number, e.g. a sweep's), else ValueError."""
  given = config.model.get("vocab_size")
  if given not in (0, None):
    return int(given)
  if dataset is not None:
    return int(dataset.vocab_size)
  name = _require(config.data, "name")
  if name == PREPARED:
    return text_vocab_size(manifest.vocab_size(_require(config.data, "path")), config.task)
  if name not in TEXT_DATASETS:
    return synthetic.vocab_size(name, _require(config.data, "num_symbols"))
  if workdir is not None and os.path.exists(os.path.join(workdir, TOKENIZER_FILE)):
    return text_vocab_size(load_tokenizer(workdir).vocab_size, config.task)
  if config.data.tokenizer == "byte":
    return text_vocab_size(ByteTokenizer().vocab_size, config.task)
  if unknown is not None:
    return unknown
  raise ValueError("model.vocab_size=0 takes the vocabulary from the data's "
                   f"'{config.data.tokenizer}' tokenizer; give it here with "
                   "--config.model.vocab_size=N")
