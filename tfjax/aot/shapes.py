"""A dataset that gives a config's batch shapes without reading its corpus, for compiling.

Compiling a step needs the shapes of one batch row and the vocabulary size, not the text: a
7B config compiled for a TPU pod must not need Tiny Shakespeare on disk (nor try to download it).
For the text datasets ('tinyshakespeare', 'text', 'prepared') the stand-in is a TextDataset over
a few synthetic paragraphs with the config's task, seq_len, mode and packing, so its rows have the
real dataset's keys, dtypes and shapes (tfjax.data.datasets documents them; a prepared
directory's rows have the same layout), and the vocabulary is the config's
(datasets.resolve_vocab_size). Synthetic tasks read no file: they are built as usual.

The one thing a corpus is needed for: model.vocab_size=0 with a 'char' or 'bpe' tokenizer, whose
vocabulary only the corpus knows; then the real dataset is built, as training would. A task with
a model of its own (ViT, CLIP, Whisper, Funnel: tfjax/training/tasks/) builds its registered
source, as training would: the synthetic ones read no file, a prepared folder is read for its
shapes.
"""

from __future__ import annotations

from tfjax.data import datasets
from tfjax.training import tasks
from tfjax.data.text_dataset import TextDataset
from tfjax.data.tokenizers import ByteTokenizer

_PARAGRAPH = "shape only " * 9 + "\n\n"  # 101 characters: several documents per row


def stand_in_dataset(config):
  """A dataset with the batch layout and vocabulary of `config.data` (module docstring)."""
  data = config.data
  task = tasks.get_task(config.task)
  if task.own_model:
    return task.make_dataset(config)
  if data.name not in datasets.TEXT_DATASETS + (datasets.PREPARED,):
    return datasets.make_dataset(data, config.task)
  try:
    vocab_size = datasets.resolve_vocab_size(config)
  except ValueError:  # a char / BPE vocabulary that only the corpus knows (module docstring)
    return datasets.make_dataset(data, config.task)
  # Both halves hold several rows of seq_len + 1 tokens.
  text = _PARAGRAPH * (4 * (int(data.seq_len) + 2) // len(_PARAGRAPH) + 4)
  dataset = TextDataset(text, ByteTokenizer(), source="(shapes only)", task=config.task,
                        seq_len=data.seq_len, val_fraction=0.5, mode=data.mode,
                        doc_split=data.doc_split, doc_chunk_tokens=data.doc_chunk_tokens,
                        eval_mode=data.eval_mode, mlm_prob=data.mlm_prob, seed=data.seed,
                        eval_seed=data.eval_seed)
  dataset.vocab_size = vocab_size  # the model's; the rows' ids (bytes) are never used
  return dataset
