"""The Hugging Face side of the registry matrix (issue 60): every model type of
tfjax.hf.registry.ARCHITECTURES imports (`python -m tfjax.hf import`, in-process), generates
(greedy, against transformers' own greedy tokens: decoders and encoder-decoders) and exports
(`python -m tfjax.hf export`; the exported tensors equal the original model's, the reloaded model's
logits bit-identical), from a tiny random transformers model (no download).

The parameters are the registry's model types, so a new type joins by registering: it fails here
until a case of tests/hf/test_hf.py's FACTORIES builds a model of that type (or OTHER_FILES names
the test that round-trips it). Each type runs test_hf.py's `_parity` (import, logits parity,
generate, export) on its first case; where that case already runs in the default suite
(test_hf.py's FAST -> test_parity), the cell says so and skips rather than run it twice.

The task model types (registry.MODALITIES: vit, clip, clip_vision_model, whisper, funnel) import
as runs of their own tasks (tfjax/hf/task_runs.py); each names the tests that import, generate
(Whisper: transcribe) and export it, and fails here if one is gone or a type has none."""

# pylint: disable=protected-access  (the shared helpers of tests/hf/test_hf.py)
from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import test_hf as parity  # noqa: E402  (the shared parity helpers and model factories)
import test_hf_bigbird  # noqa: E402
import test_hf_longformer  # noqa: E402
import test_hf_task_runs  # noqa: E402
import test_hf_whisper_generate  # noqa: E402
from tfjax.hf import registry  # noqa: E402

# Types whose tiny models need more than a FACTORIES entry (their own attention kinds, global
# tokens, block layouts): MLM encoders, so nothing to generate; their files import and export them.
OTHER_FILES = {
    "big_bird": (test_hf_bigbird, "test_bigbird_mlm_parity_and_export_round_trip"),
    "longformer": (test_hf_longformer, "test_export_round_trip"),
}


@functools.lru_cache(maxsize=None)
def cases_by_type() -> dict:
  """model_type -> test_hf.py FACTORIES names of that type, FAST ones first."""
  out = {}
  for name in sorted(parity.FACTORIES, key=lambda n: (n not in parity.FAST, n)):
    out.setdefault(parity.FACTORIES[name]().config.model_type, []).append(name)
  return out


def test_every_registered_model_type_has_a_case():
  covered = set(cases_by_type()) | set(OTHER_FILES)
  missing = sorted(set(registry.ARCHITECTURES) - covered)
  assert not missing, (f"model types {missing} are registered in tfjax.hf.registry but no tiny "
                       "model builds them: add a case to tests/hf/test_hf.py FACTORIES")
  for module, test in OTHER_FILES.values():
    assert callable(getattr(module, test, None)), f"{module.__name__}.{test} is gone"


@pytest.mark.parametrize("model_type", sorted(registry.ARCHITECTURES))
def test_model_type_imports_generates_exports(tmp_path, model_type):
  if model_type in OTHER_FILES:
    module, test = OTHER_FILES[model_type]
    pytest.skip(f"{model_type} is an MLM encoder (nothing to generate); imported and exported by "
                f"{module.__name__}.py::{test}")
  name = cases_by_type()[model_type][0]
  if name in parity.FAST:
    pytest.skip(f"runs in the default suite as tests/hf/test_hf.py::test_parity[{name}]")
  arch = registry.ARCHITECTURES[model_type]
  assert (name in parity.DECODERS) == (arch.task == "lm")  # the generate step runs for lm types
  assert (name in parity.SEQ2SEQ) == (arch.task == "seq2seq")  # and seq2seq; mlm: none
  parity._parity(tmp_path, name)


# Task model types -> (test_hf_task_runs.CASES names: import -> export bit-exact, fine-tune cases,
# the generate test or None).
TASK_TYPES = {
    "vit": (("vit_classifier", "vit_model", "vit_model_no_pooler"), ("vit_classifier",), None),
    "clip_vision_model": (("clip_vision",), (), None),
    "clip": (("clip",), ("clip",), None),
    "whisper": (("whisper", "whisper_model"), ("whisper",),
                (test_hf_whisper_generate, "test_transcription_equals_transformers_generate")),
    "funnel": (("funnel_mlm", "funnel_classification", "funnel_base", "funnel_model"),
               ("funnel_mlm",), None),
}


def test_every_task_model_type_imports_exports_and_fine_tunes():
  assert set(TASK_TYPES) == set(registry.MODALITIES), (
      "a task model type of tfjax.hf.registry.MODALITIES has no row here: add its cases to "
      "tests/hf/test_hf_task_runs.py and TASK_TYPES")
  for model_type, (round_trips, fine_tunes, generate) in TASK_TYPES.items():
    assert round_trips and set(round_trips) <= set(test_hf_task_runs.CASES), model_type
    assert set(fine_tunes) <= set(test_hf_task_runs.FINE_TUNE), model_type
    if generate is not None:
      module, test = generate
      assert callable(getattr(module, test, None)), f"{module.__name__}.{test} is gone"
  # a class of each type that is not a ModelConfig family: the text path says where it goes
  for model_type in registry.MODALITIES:
    with pytest.raises(registry.UnsupportedError, match="run of its own task"):
      registry.architecture(model_type)
