"""The registry matrix (issue 60): every registered attention kind x every model family it accepts,
and every registered position kind (softmax decoder), trains 5 steps on 1 and on 2 CPU devices.

The cells come from the registries (tests/registry_matrix_helper.py enumerates ATTENTION_KINDS x
FAMILIES and POSITION_KINDS), so a new kind joins by registering: its cells train here, or, where
its check() refuses a family, the refusal must name the family (any other refusal, e.g. a kind key
default that does not fit the tiny rows, fails here by name). The helper runs in two subprocesses
at once (2 XLA:CPU devices each, half the cells each) so the suite's own process keeps one
device. Hugging Face model types: tests/hf/test_hf_registry_matrix.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.nn import attention_kinds, positions
from tfjax.nn.config import FAMILIES

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = 2


@pytest.fixture(scope="module")
def report():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS="--xla_force_host_platform_device_count=2",
             PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
  procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "registry_matrix_helper.py"),
                             f"{i}/{PARTS}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(PARTS)]
  merged = {"cells": {}}
  for proc in procs:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-4000:]
    part = json.loads(out.strip().splitlines()[-1])
    merged["cells"].update(part.pop("cells"))
    merged.update(part)
  return merged


def _trained(report):
  return {key: cell["losses"] for key, cell in report["cells"].items() if "losses" in cell}


def test_cells_are_what_the_registries_list(report):
  """The helper saw this process's registries, ran every kind x family and every position kind,
  and every refusal is a family refusal (named in the kind's message)."""
  assert report["kinds"] == list(attention_kinds.ATTENTION_KINDS)
  assert report["position_kinds"] == list(positions.POSITION_KINDS)
  assert report["families"] == list(FAMILIES)
  expected = {f"{kind}/{family}/learned" for kind in attention_kinds.ATTENTION_KINDS
              for family in FAMILIES}
  expected |= {f"softmax/decoder/{position}" for position in positions.POSITION_KINDS}
  assert set(report["cells"]) == expected
  trained = _trained(report)
  for key, cell in report["cells"].items():
    if "rejected" in cell:
      family = key.split("/")[1]
      assert f"family={family!r}" in cell["rejected"], (
          f"{key} was refused for a reason other than its family: {cell['rejected']}")
  for kind in attention_kinds.ATTENTION_KINDS:
    assert any(key.startswith(f"{kind}/") for key in trained), f"no family trains {kind}"
  # The default kind takes every family; the position kinds all train (softmax decoder).
  assert {f"softmax/{family}/learned" for family in FAMILIES} <= set(trained)
  assert {f"softmax/decoder/{p}" for p in positions.POSITION_KINDS} <= set(trained)


def test_every_cell_trains_and_meshes_agree(report):
  bad = []
  for key, losses in sorted(_trained(report).items()):
    one, two = np.asarray(losses["1"]), np.asarray(losses["2"])
    if len(one) != 5 or len(two) != 5 or not (np.isfinite(one).all() and np.isfinite(two).all()):
      bad.append(f"{key}: not 5 finite losses: {losses}")
    elif not one[-1] < one[0]:
      bad.append(f"{key}: loss did not fall over 5 steps: {one.tolist()}")
    elif not np.allclose(one, two, rtol=1e-4, atol=0):
      bad.append(f"{key}: 1 vs 2 devices differ: {one.tolist()} vs {two.tolist()}")
  assert not bad, "\n".join(bad)
