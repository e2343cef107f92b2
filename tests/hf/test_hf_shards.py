"""Sharded safetensors export (tfjax/hf/shards.py): sizes as transformers spells them, the
shard plan, and an export above --max_shard_size that transformers and tfjax both load back."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tfjax.hf import shards


def test_parse_size_units():
  assert shards.parse_size("500MB") == 500 * 10 ** 6
  assert shards.parse_size("5GB") == 5 * 10 ** 9
  assert shards.parse_size("2GiB") == 2 * 2 ** 30
  assert shards.parse_size("1.5kb") == 1500
  assert shards.parse_size(1234) == shards.parse_size("1234") == 1234
  for bad in ("5 parsecs", "-3MB", "0", "MB"):
    with pytest.raises(ValueError, match="max_shard_size"):
      shards.parse_size(bad)


def test_plan_fills_in_order_and_isolates_oversized_tensors():
  sizes = {"a": 4, "b": 4, "c": 3, "big": 20, "d": 1, "e": 9}
  assert shards.plan(sizes, 10) == [["a", "b"], ["c"], ["big"], ["d", "e"]]
  assert shards.plan(sizes, 1000) == [list(sizes)]
  for group in shards.plan(sizes, 10):  # every shard within the limit unless one tensor is over
    assert sum(sizes[n] for n in group) <= 10 or len(group) == 1


def test_sharded_export_loads_in_transformers_and_tfjax(tmp_path):
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  import test_hf as parity  # pylint: disable=import-outside-toplevel
  from tfjax.hf import __main__ as cli  # pylint: disable=import-outside-toplevel
  from tfjax.hf import importer  # pylint: disable=import-outside-toplevel
  model, hf_dir = parity._hf_dir(tmp_path, "llama3")  # pylint: disable=protected-access
  run = parity._import(hf_dir, str(tmp_path / "run"))  # pylint: disable=protected-access
  out = str(tmp_path / "out")
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out}",
                   "--max_shard_size=20KB"]) == 0
  index = json.load(open(os.path.join(out, shards.INDEX_FILE)))
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and not os.path.exists(os.path.join(out, shards.SINGLE_FILE))
  assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  sizes = [os.path.getsize(os.path.join(out, f)) for f in files]
  assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
  assert max(sizes) < 20_000 + 4 * 97 * 32 + 2_000  # over the limit only by one tensor + header
  reloaded = parity.T.AutoModelForCausalLM.from_pretrained(out).eval()
  for key, value in reloaded.state_dict().items():
    assert torch.equal(value, model.state_dict()[key]), key
  cfg, params = importer.load(out)
  assert cfg == run.model_config
  import jax  # pylint: disable=import-outside-toplevel
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(run.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Exporting again into the same directory is refused; nothing there changes.
  before = {f: os.path.getmtime(os.path.join(out, f)) for f in os.listdir(out)}
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out}"]) == 2
  assert before == {f: os.path.getmtime(os.path.join(out, f)) for f in os.listdir(out)}
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={tmp_path / 'o2'}",
                   "--max_shard_size=lots"]) == 2
  assert not os.path.exists(tmp_path / "o2")
