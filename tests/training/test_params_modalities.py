"""`python -m tfjax.params` on configs/{vit,clip,whisper,funnel}_synthetic.py (the modality models):
the total against the parameter count of the equivalent transformers model built on CPU from the
config file's sizes (no weights downloaded), ViT's categories against a closed form, the command
line's last line, and the clear error for --mesh."""

import functools
import importlib.util
import pathlib
import subprocess
import sys

import jax
import pytest

from tfjax.training import tasks
from tfjax.training.accounting import params as tfparams
from tfjax.training.tasks import own_model

transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = ("vit", "clip", "whisper", "funnel")


def config_file(name):
  spec = importlib.util.spec_from_file_location(f"configs_{name}_synthetic",
                                                ROOT / "configs" / f"{name}_synthetic.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@functools.lru_cache(maxsize=None)
def hf_count(name) -> int:
  """Parameters of the transformers model with the config file's sizes, written out here from
  the config's fields (model.parameters() counts a tied table once)."""
  m = config_file(name).model
  if name == "vit":
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=m.image_size, patch_size=m.patch_size, num_channels=m.channels,
        hidden_size=m.d_model, num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
        intermediate_size=m.d_ff, num_labels=m.num_classes))
    return sum(p.numel() for p in model.parameters())
  if name == "clip":
    t, v = m.text, m.vision
    model = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=t.vocab_size, max_position_embeddings=t.max_len,
                         hidden_size=t.d_model, num_hidden_layers=t.num_layers,
                         num_attention_heads=t.num_heads, intermediate_size=t.d_ff),
        vision_config=dict(image_size=v.image_size, patch_size=v.patch_size,
                           num_channels=v.channels, hidden_size=v.d_model,
                           num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads,
                           intermediate_size=v.d_ff),
        projection_dim=m.projection_dim))
    return sum(p.numel() for p in model.parameters())
  if name == "whisper":
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=m.vocab_size, num_mel_bins=m.num_mels, d_model=m.d_model,
        encoder_layers=m.encoder_layers, encoder_attention_heads=m.encoder_heads,
        encoder_ffn_dim=m.encoder_ffn, decoder_layers=m.decoder_layers,
        decoder_attention_heads=m.decoder_heads, decoder_ffn_dim=m.decoder_ffn,
        max_source_positions=m.max_source_positions,
        max_target_positions=m.max_target_positions, pad_token_id=0, bos_token_id=1,
        decoder_start_token_id=m.decoder_start_id, eos_token_id=m.eos_id,
        begin_suppress_tokens=None, suppress_tokens=None))  # token ids within the vocabulary
    # Two documented differences (tfjax/hf/models/whisper.py): HF stores the encoder's sinusoid
    # table as a parameter (tfjax computes it), and HF's k_proj has no bias (tfjax's key has one).
    sinusoids = model.model.encoder.embed_positions.weight.numel()
    k_biases = sum(mod.k_proj.out_features for mod in model.modules()
                   if isinstance(mod, transformers.models.whisper.modeling_whisper
                                 .WhisperAttention))
    assert k_biases == (m.encoder_layers + 2 * m.decoder_layers) * m.d_model
    return sum(p.numel() for p in model.parameters()) - sinusoids + k_biases
  model = transformers.FunnelForMaskedLM(transformers.FunnelConfig(
      vocab_size=m.vocab_size, block_sizes=list(m.block_sizes),
      num_decoder_layers=m.num_decoder_layers, d_model=m.d_model, n_head=m.n_head,
      d_head=m.d_head, d_inner=m.d_inner, pooling_type=m.pooling,
      attention_type=m.attention_type, separate_cls=m.separate_cls,
      truncate_seq=m.truncate_seq, pool_q_only=m.pool_q_only))
  return sum(p.numel() for p in model.parameters())


def shapes(name):
  """The parameter shapes of the model the task trains (its init, abstract)."""
  config = config_file(name)
  task = tasks.get_task(config.task)
  return own_model.boxed_param_shapes(task, config, task.model_config(config))


@pytest.mark.parametrize("name", NAMES)
def test_total_equals_the_transformers_model(name):
  counts = tfparams.modality_count_by_category(shapes(name))
  assert set(counts) == set(tfparams.CATEGORIES)
  assert sum(counts.values()) == hf_count(name)
  assert tfparams.modality_report(shapes(name)).splitlines()[-1] == \
      f"total: {sum(counts.values())}"


def test_vit_categories_match_a_closed_form():
  m = config_file("vit").model
  d, f, n, p, c = m.d_model, m.d_ff, m.num_layers, m.patch_size, m.channels
  patches = (m.image_size // p) ** 2
  want = {"embeddings": p * p * c * d + d + d + (patches + 1) * d,  # patch kernel+bias, [CLS]
          "attention": n * (4 * d * d + 4 * d),
          "ffn": n * (2 * d * f + f + d),
          "norms": (2 * n + 1) * 2 * d,  # two per layer and the final one, scale and bias
          "output head": d * m.num_classes + m.num_classes}
  assert dict(tfparams.modality_count_by_category(shapes("vit"))) == want


def test_an_unplaced_parameter_is_refused():
  with pytest.raises(AssertionError, match="no category"):
    tfparams._modality_category(("new_head", "kernel"))  # pylint: disable=protected-access


def _cli(*flags):
  return subprocess.run([sys.executable, "-m", "tfjax.params", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["funnel", "whisper"])
def test_cli_prints_the_breakdown_and_total_last(name):
  result = _cli(f"--config=configs/{name}_synthetic.py")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[-1] == f"total: {hf_count(name)}"
  assert [line.split()[0] for line in lines[:-1]] == ["embeddings", "attention", "ffn", "norms",
                                                      "output"]


def test_cli_mesh_on_a_modality_config_is_one_clear_error():
  result = _cli("--config=configs/vit_synthetic.py", "--mesh=1,2,1")
  assert result.returncode == 2
  assert result.stdout == ""
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "text families only" in errors[0] and "drop --mesh" in errors[0]
  assert "Traceback" not in result.stderr
