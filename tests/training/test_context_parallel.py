"""Sequence (context) parallelism end to end: `experiments/train.py` on the default config, 20
steps on 4 CPU devices with the sequence split 4 ways (`--config.mesh.context=4`), gives the
losses of the same run on one device.

On 4 devices the attention is chunked (the context axis' implementation, resolve_auto), run per
device with K/V all-gathered and the queries zigzag-dealt (tfjax/nn/sharded_attention.py), the
batch's sequences padded to a multiple of 8 (BatchPlacement.padded); on one device it is xla over
unpadded sequences. So equal losses check the all-gather, the deal, the global positions (RoPE)
and the padding together.
"""

import pytest

from run_helpers import read_metrics, run_cli

STEPS = 20


def _run(tmp_path, name, *flags):
  result = run_cli([f"--workdir={tmp_path / name}", f"--config.train.num_steps={STEPS}",
                    "--config.train.log_every=1", "--config.train.eval_at_start=False",
                    "--config.train.checkpoint_every=1000", *flags], tmp_path, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = read_metrics(tmp_path / name)
  train = {m["step"]: m["train/loss"] for m in rows if "train/loss" in m}
  final_eval = [m["eval/loss"] for m in rows if "eval/loss" in m][-1]
  return train, final_eval, result.stderr


def test_default_run_with_the_sequence_split_over_4_devices_matches_one_device(tmp_path):
  one, one_eval, _ = _run(tmp_path, "one", "--config.mesh.cpu_devices=1")
  four, four_eval, log = _run(tmp_path, "ctx4", "--config.mesh.cpu_devices=4",
                              "--config.mesh.data=1", "--config.mesh.context=4")
  assert "'context': 4} over 4 cpu devices" in log and "attention: chunked" in log
  assert sorted(one) == sorted(four) == list(range(1, STEPS + 1))
  for step in one:
    assert four[step] == pytest.approx(one[step], rel=2e-5, abs=2e-5), step
  assert four_eval == pytest.approx(one_eval, rel=2e-5)


@pytest.mark.parametrize("kind", ["performer"])  # the decoder kinds besides softmax
def test_a_kind_without_a_context_parallel_form_is_refused_by_name(kind, monkeypatch):
  from tfjax.training.config import defaults  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  config = defaults.get_config()
  config.model.attention_kind = kind
  config.mesh.update(data=1, context=4, cpu_devices=0)
  monkeypatch.setattr("jax.device_count", lambda: 4)
  with pytest.raises(ValueError, match=f"attention_kind='{kind}' over mesh.context=4.*"
                                       "set mesh.context=1"):
    experiment.prepare(config)
