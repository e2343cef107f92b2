"""Per-layer gradient norms at initialization (tfjax/research/grad_norms.py): the per-layer split of a
gradient tree against NumPy in both layer layouts (a Python loop and nn.scan), and the norms of a
real decoder against gradients the test takes itself, with its own cross-entropy in optax."""

import jax
import numpy as np
import pytest

from tfjax.research import grad_norms
from tfjax.training.config.defaults import base_config


def _layer(rng, scale):
  return {"ffn": {"wi": {"kernel": rng.normal(size=(4, 8)) * scale},
                  "wo": {"kernel": rng.normal(size=(8, 4)) * scale}},
          "self_attention": {"query": {"kernel": rng.normal(size=(4, 2, 2)) * scale}},
          "ffn_norm": {"scale": rng.normal(size=(4,)) * scale}}


def test_layer_split_matches_numpy_in_both_layouts():
  rng = np.random.default_rng(0)
  layers = [_layer(rng, scale) for scale in (1.0, 10.0, 0.1)]
  rest = {"embed": {"embedding": rng.normal(size=(16, 4))},
          "final_norm": {"scale": rng.normal(size=(4,))}}
  unrolled = {"decoder": {f"layers_{i}": layer for i, layer in enumerate(layers)}, **rest}
  stacked = jax.tree.map(lambda *per_layer: np.stack(per_layer), *layers)  # nn.scan's layout
  scanned = {"decoder": {"layers": stacked}, **rest}

  expected = {}
  for i, layer in enumerate(layers, 1):
    leaves = [layer["ffn"]["wi"]["kernel"], layer["ffn"]["wo"]["kernel"],
              layer["self_attention"]["query"]["kernel"], layer["ffn_norm"]["scale"]]
    expected[f"init/grad_norm_ffn_wo@{i}"] = np.linalg.norm(layer["ffn"]["wo"]["kernel"])
    expected[f"init/grad_norm_layer@{i}"] = np.sqrt(sum(np.sum(x ** 2) for x in leaves))
  assert grad_norms.layer_grad_norms(unrolled, 3) == pytest.approx(expected, rel=1e-12)
  assert grad_norms.layer_grad_norms(scanned, 3) == pytest.approx(expected, rel=1e-12)
  table = grad_norms.format_table(expected).splitlines()
  assert len(table) == 4 and table[2].split()[0] == "2"

  with pytest.raises(ValueError, match="leading axis of 4 layers"):
    grad_norms.layer_grad_norms(scanned, 4)
  with pytest.raises(ValueError, match="no encoder/layers"):
    grad_norms.layer_grad_norms(unrolled, 3, stack="encoder")


def _tiny_decoder(scan_layers=False):
  config = base_config()
  config.task = "lm"
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(6,),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=3, num_heads=2,
                      d_ff=32, max_len=32, dropout=0.3, scan_layers=scan_layers)
  config.train.update(batch_size=8)
  return config


def test_norms_of_a_decoder_equal_the_tests_own_gradients():
  import optax  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  config = _tiny_decoder()
  norms = grad_norms.per_layer_grad_norms(config)
  assert len(norms) == 6 and all(v > 0 and np.isfinite(v) for v in norms.values())

  # The reference: the same initial params and first batch, the mean token cross-entropy written
  # here with optax, dropout off (deterministic model), the gradient by jax.grad.
  exp = experiment.prepare(config)
  state = experiment.state_layout(exp, sharding.BatchPlacement.for_config(config)).init()
  batch = exp.dataset.train_batch(0, config.train.batch_size)
  model = build_model(exp.model_config)

  def loss(params):
    logits = model.apply({"params": params}, batch["inputs"], positions=batch.get("positions"),
                         segment_ids=batch.get("segment_ids"))
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    return (nll * batch["weights"]).sum() / batch["weights"].sum()

  grads = jax.device_get(jax.jit(jax.grad(loss))(state.params))  # eager took ~4 s more CPU
  for i in range(3):
    layer = grads["decoder"][f"layers_{i}"]
    assert norms[f"init/grad_norm_ffn_wo@{i + 1}"] == pytest.approx(
        float(np.linalg.norm(layer["ffn"]["wo"]["kernel"])), rel=1e-4)
    assert norms[f"init/grad_norm_layer@{i + 1}"] == pytest.approx(
        float(optax.global_norm(layer)), rel=1e-4)


def test_scanned_decoder_reports_every_layer_and_other_families_are_refused():
  norms = grad_norms.per_layer_grad_norms(_tiny_decoder(scan_layers=True))
  assert sorted(norms) == sorted(f"init/grad_norm_{k}@{i}" for k in ("ffn_wo", "layer")
                                 for i in (1, 2, 3))
  assert all(v > 0 and np.isfinite(v) for v in norms.values())
  config = base_config()
  config.task = "seq2seq"
  config.data.update(name="reverse", form="seq2seq", train_lengths=(1, 4), test_lengths=(4,),
                     num_symbols=8)
  config.model.update(family="encoder_decoder", vocab_size=0, d_model=16, num_layers=1,
                      num_heads=2, d_ff=32, max_len=32)
  with pytest.raises(ValueError, match="decoder-only models; model.family is 'encoder_decoder'"):
    grad_norms.per_layer_grad_norms(config)
