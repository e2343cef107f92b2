"""Max |tfjax - transformers| of the modality front-ends (docs/modalities.md's parity table).

  python experiments/modality_parity.py

Small random HF models (ViT, CLIP, Whisper; every weight moved by N(0, 0.3^2) so LayerNorms are
not identities), saved with save_pretrained, imported with tfjax.hf.modalities.load, run on the
same random inputs in float32 on CPU. The same cases are asserted within 1e-5 by
tests/modalities/.
"""

import tempfile

import numpy as np
import torch
import transformers as T

from tfjax.hf import modalities
from tfjax.nn import audio
from tfjax.nn.clip import contrastive_loss


def perturbed(model, skip=()):
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name not in skip:
        p.add_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def imported(model):
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)
    return modalities.load(tmp)


def diff(got, want) -> str:
  want = want.detach().numpy() if hasattr(want, "detach") else want
  return f"{np.abs(np.asarray(got) - want).max():.2e} (|ref| max {np.abs(want).max():.2f})"


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(1)
  vit = perturbed(T.ViTForImageClassification(T.ViTConfig(
      hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
      image_size=16, patch_size=4, num_labels=5)))
  cfg, params = imported(vit)
  x = rng.normal(size=(8, 16, 16, 3)).astype(np.float32)
  with torch.no_grad():
    want = vit(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2))).logits
  got = modalities.model(cfg).apply({"params": params}, x)["logits"]
  print(f"| ViT | logits [8, 5] | {diff(got, want)} |")

  clip = perturbed(T.CLIPModel(T.CLIPConfig(
      text_config=dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=12, eos_token_id=7),
      vision_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=4, image_size=16, patch_size=4),
      projection_dim=16)), skip=("logit_scale",))
  cfg, params = imported(clip)
  images = rng.normal(size=(8, 16, 16, 3)).astype(np.float32)
  ids = rng.integers(8, 50, size=(8, 10))
  ids[np.arange(8), rng.integers(2, 10, size=8)] = 7
  with torch.no_grad():
    want = clip(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)),
                input_ids=torch.from_numpy(ids), return_loss=True)
  got = modalities.model(cfg).apply({"params": params}, images, ids.astype(np.int32))
  for key in ("image_embeds", "text_embeds", "logits_per_image"):
    print(f"| CLIP | {key} | {diff(got[key], getattr(want, key))} |")
  loss = contrastive_loss(got["logits_per_image"])
  print(f"| CLIP | contrastive loss (return_loss=True) | {diff(loss, want.loss)} |")

  whisper = perturbed(T.WhisperForConditionalGeneration(T.WhisperConfig(
      vocab_size=40, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=48,
      decoder_ffn_dim=40, max_source_positions=16, max_target_positions=20,
      decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, bos_token_id=1,
      begin_suppress_tokens=None, suppress_tokens=None)),
      skip=("model.encoder.embed_positions.weight",))
  cfg, params = imported(whisper)
  feats = rng.normal(size=(8, 32, 8)).astype(np.float32)
  dec = rng.integers(3, 40, size=(8, 7))
  with torch.no_grad():
    want = whisper(input_features=torch.from_numpy(feats.transpose(0, 2, 1)),
                   decoder_input_ids=torch.from_numpy(dec)).logits
    generated = whisper.generate(input_features=torch.from_numpy(feats.transpose(0, 2, 1)),
                                 max_new_tokens=12, do_sample=False, num_beams=1).numpy()
  got = audio.Whisper(cfg).apply({"params": params}, feats, dec.astype(np.int32))
  print(f"| Whisper | logits [8, 7, 40] | {diff(got, want)} |")
  greedy = np.asarray(audio.greedy_decode(cfg, params, feats, 12))[:, 1:generated.shape[1] + 1]
  print(f"| Whisper | greedy tokens [8, 12] vs generate | "
        f"{'equal' if np.array_equal(greedy, generated) else 'DIFFERENT'} |")


if __name__ == "__main__":
  main()
