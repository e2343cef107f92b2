"""Captions made from class names by templates, for contrastive training on a labelled image
folder (config.task='clip', data.name='image_folder') and for zero-shot classification.

A template is a string with one `{name}` slot ("a photo of the digit {name}"); the caption of an
image of class c under template t is t with c's name (its folder's name, e.g. '3') in the slot.
Token ids are words: 0 padding, 1 end of caption (the text tower pools there: model.text.eos_id
= 1), then the sorted words of the templates and class names from 2. A caption is its words,
EOS, then padding to model.text.max_len.
"""

from __future__ import annotations

import numpy as np

PAD, EOS, FIRST_WORD = 0, 1, 2


class CaptionVocabulary:
  """Word ids of the captions `templates` x `class_names` make (module docstring)."""

  def __init__(self, templates, class_names, max_len: int):
    templates, class_names = list(templates), [str(n) for n in class_names]
    if not templates:
      raise ValueError("data.templates is empty: give at least one caption template with a "
                       "{name} slot, e.g. ('a photo of a {name}',)")
    for template in templates:
      if not isinstance(template, str) or template.count("{name}") != 1:
        raise ValueError(f"data.templates entry {template!r} must hold exactly one {{name}} slot "
                         "(e.g. 'a photo of the digit {name}')")
    self.templates, self.class_names, self.max_len = templates, class_names, int(max_len)
    words = sorted({w for t in templates for n in class_names for w in t.format(name=n).split()})
    self.ids = {w: FIRST_WORD + i for i, w in enumerate(words)}
    self.vocab_size = FIRST_WORD + len(words)
    self.captions_CxTxL = np.stack([np.stack([self._encode(t.format(name=n)) for t in templates])
                                    for n in class_names])

  def _encode(self, caption: str) -> np.ndarray:
    words = caption.split()
    if len(words) + 1 > self.max_len:
      raise ValueError(f"caption {caption!r} has {len(words)} words + EOS, more than "
                       f"model.text.max_len={self.max_len}: raise max_len or shorten the template")
    out = np.full((self.max_len,), PAD, np.int32)
    out[:len(words)] = [self.ids[w] for w in words]
    out[len(words)] = EOS
    return out

  def decode(self, ids) -> str:
    """The words of one caption's ids (up to EOS)."""
    names = {i: w for w, i in self.ids.items()}
    out = []
    for i in np.asarray(ids).tolist():
      if i == EOS:
        break
      out.append(names[i])
    return " ".join(out)

  def caption_ids(self, labels_B, templates_B) -> np.ndarray:
    """int32 [B, max_len]: the caption of each (class, template index)."""
    return self.captions_CxTxL[np.asarray(labels_B), np.asarray(templates_B)]
