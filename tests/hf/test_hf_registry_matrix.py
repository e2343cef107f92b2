"""The Hugging Face side of the registry matrix (issue 60): every model type of
tfjax.hf.registry.ARCHITECTURES imports (`python -m tfjax.hf import`, in-process), generates
(greedy, against transformers' own greedy tokens: decoders and encoder-decoders) and exports
(`python -m tfjax.hf export`; the exported tensors equal the original model's, the reloaded model's
logits bit-identical), from a tiny random transformers model (no download).

The parameters are the registry's model types, so a new type joins by registering: it fails here
until a case of tests/hf/test_hf.py's FACTORIES builds a model of that type (or OTHER_FILES names
the test that round-trips it). Each type runs test_hf.py's `_parity` (import, logits parity,
generate, export) on its first case; where that case already runs in the default suite
(test_hf.py's FAST -> test_parity), the cell says so and skips rather than run it twice."""

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
