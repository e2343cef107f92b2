"""Attention kernels on every mesh (tfjax/nn/sharded_attention.py): outputs and dq/dk/dv on 8 CPU
devices equal the one-device kernel's, for every mesh (data, fsdp, tensor, context) of the list
below; the zigzag deal balances causal work; what cannot work is refused by name.

The 8-device checks run in ONE subprocess (tests/nn/sharded_attention_cases.py) so this process
keeps its single device.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.nn import sharded_attention

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sharded_attention_cases import CASES, meshes  # pylint: disable=wrong-import-position

RULES = (("batch", ("data", "fsdp")), ("length", "context"), ("heads", "tensor"),
         ("kv_heads", "tensor"))


@pytest.fixture(scope="module")
def report():
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip())
  result = subprocess.run([sys.executable, os.path.join(HERE, "sharded_attention_cases.py")],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_mesh_gives_the_one_device_outputs_and_gradients(report):
  cases = report["cases"]
  expected = {f"{name}@{','.join(map(str, shape))}" for name in CASES for shape in meshes(name)}
  assert set(cases) == expected
  for name, errors in cases.items():
    assert errors["per_device"], name  # the kernel ran per device inside shard_map
    for what in ("out", "dq", "dk", "dv"):
      assert errors[what] < 1e-5, (name, what, errors[what])


def test_zigzag_gives_every_context_device_chunks_i_and_2n_minus_1_minus_i(report):
  dealt = np.asarray(report["dealt"])  # [device, its 8 positions] of 64 = 16 chunks of 4
  n, chunk = 8, 4
  for device, positions in enumerate(dealt):
    chunks = sorted({int(p) // chunk for p in positions})
    assert chunks == sorted([device, 2 * n - 1 - device])
  # Causal work per device: the number of visible (query, key) pairs is the same on all devices.
  work = [int(sum(p + 1 for p in positions)) for positions in dealt]
  assert len(set(work)) == 1, work
  # Without the deal (contiguous blocks) the last device would do 13x the first one's work.
  contiguous = [int(sum(p + 1 for p in range(d * 8, d * 8 + 8))) for d in range(n)]
  assert contiguous[-1] / contiguous[0] > 13


def test_every_position_kind_reads_global_positions_over_a_context_axis(report):
  """A whole decoder on (data 2, context 4): learned and sinusoidal tables, ALiBi, T5 buckets
  (xla, partitioned by GSPMD) and RoPE under the Pallas kernel give the one-device loss and
  parameter gradients."""
  assert set(report["positions"]) == {"learned/chunked", "sinusoidal/chunked", "alibi/chunked",
                                      "t5_bias/auto", "rope/pallas"}
  for name, error in report["positions"].items():
    assert error < 1e-5, (name, error)


def test_what_cannot_work_is_refused_by_name(report):
  refusals = report["refusals"]
  message = refusals["pallas_context_bidirectional_alibi"]
  assert "ALiBi and no causal mask" in message and "'chunked'" in message
  # xla over the context axis through 'auto' on a CPU host (per-platform lowering) would hash
  # block-local query indices: refused; 'pallas' takes the offsets (the cases above).
  assert "dropout" in refusals["dropout_context"] and "'pallas'" in refusals["dropout_context"]
  assert "multiple of 8" in refusals["indivisible_length"]


@pytest.mark.parametrize("free, q, k, expected", [
    # batch over data x fsdp, heads and kv heads over tensor
    ({"data": 2, "fsdp": 2, "tensor": 2}, (8, 16, 8, 4), (8, 16, 2, 4),
     sharded_attention.Layout(("data", "fsdp"), ("tensor",), ("tensor",))),
    # MQA on 4 tensor shards: heads split, the one kv head kept whole (each shard reads it)
    ({"tensor": 4}, (2, 16, 8, 4), (2, 16, 1, 4),
     sharded_attention.Layout((), ("tensor",), ())),
    # 6 kv heads on 4 shards: no whole group per shard, heads stay whole
    ({"tensor": 4}, (2, 16, 12, 4), (2, 16, 6, 4), sharded_attention.Layout()),
    # a batch of 3 on 2 data shards stays whole; the context axis splits q and k/v
    ({"data": 2, "context": 2}, (3, 16, 4, 4), (3, 16, 4, 4),
     sharded_attention.Layout((), (), (), ("context",), ("context",), True)),
    # decoding (one query) under a context axis: only the cache is gathered, no query split
    ({"context": 4}, (2, 1, 4, 4), (2, 16, 4, 4),
     sharded_attention.Layout((), (), (), (), ("context",), False)),
    # a causal prefill of 8 queries after 8 cached keys: the queries stay whole (end-aligned)
    ({"context": 4}, (2, 8, 4, 4), (2, 16, 4, 4),
     sharded_attention.Layout((), (), (), (), ("context",), False)),
])
def test_layout_follows_the_rules_and_divisibility(free, q, k, expected):
  assert sharded_attention.layout(q, k, causal=True, window=None, rules=RULES,
                                  free=free) == expected


def test_no_mesh_means_the_kernel_is_called_as_it_is():
  assert sharded_attention.layout((2, 8, 2, 4), (2, 8, 2, 4), causal=True, window=None) == \
      sharded_attention.Layout()
