"""Whisper's log-mel spectrogram in NumPy: the math of transformers' WhisperFeatureExtractor
(and of OpenAI's whisper/audio.py), so that tfjax-prepare needs neither torch nor transformers.

For a mono waveform at 16 kHz (float, [-1, 1]):
  1. pad with zeros (or truncate) to chunk_seconds x 16,000 samples (30 s: 480,000);
  2. STFT: a periodic Hann window of n_fft = 400 samples, hop 160 (10 ms), the signal centered
     (reflect-padded by n_fft / 2 at both ends); |X|^2 of the 201 frequency bins; the last frame
     dropped, leaving chunk_seconds x 100 frames (3,000);
  3. mel: n_mels (80, or 128 for large-v3) triangular filters over 0-8 kHz on the Slaney mel
     scale (linear below 1 kHz, logarithmic above), each scaled by 2 / its width in Hz (Slaney
     area normalization);
  4. log10(max(mel, 1e-10)); clamp from below at (the spectrogram's maximum - 8), i.e. 80 dB of
     dynamic range; then (x + 4) / 4.
Computed in float64 (as transformers' NumPy path) and returned as float32 [frames, n_mels]: time
first, the layout tfjax's Whisper encoder takes (transformers' input_features are [n_mels, frames]).
"""

from __future__ import annotations

import numpy as np

SAMPLING_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
MEL_FLOOR = 1e-10  # power floor before log10
DYNAMIC_RANGE = 8.0  # log10 units kept below the maximum (80 dB)
MEL_BINS = (80, 128)  # Whisper's: 80, and 128 for large-v3

# The Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above, 27 mels per
# factor 6.4 in frequency.
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _LINEAR_HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(hz):
  hz = np.asarray(hz, np.float64)
  linear = hz / _LINEAR_HZ_PER_MEL
  log = _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP
  return np.where(hz >= _BREAK_HZ, log, linear)


def mel_to_hz(mel):
  mel = np.asarray(mel, np.float64)
  linear = mel * _LINEAR_HZ_PER_MEL
  log = _BREAK_HZ * np.exp(_LOG_STEP * (np.maximum(mel, _BREAK_MEL) - _BREAK_MEL))
  return np.where(mel >= _BREAK_MEL, log, linear)


def mel_filters(n_mels: int, sampling_rate: int = SAMPLING_RATE, n_fft: int = N_FFT,
                max_hz: float = 8000.0) -> np.ndarray:
  """[n_fft // 2 + 1, n_mels] triangular Slaney-normalized filters (float64)."""
  bins_hz = np.linspace(0.0, sampling_rate // 2, n_fft // 2 + 1)
  # n_mels + 2 edges equally spaced in mel: filter m rises from edge m to m + 1, falls to m + 2.
  edges_hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(max_hz), n_mels + 2))
  lower, center, upper = edges_hz[:-2], edges_hz[1:-1], edges_hz[2:]
  rising = (bins_hz[:, None] - lower) / (center - lower)
  falling = (upper - bins_hz[:, None]) / (upper - center)
  triangles_FxM = np.maximum(0.0, np.minimum(rising, falling))
  return triangles_FxM * (2.0 / (upper - lower))  # equal area per filter


def _power_spectrogram(audio: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
  """[frames, n_fft // 2 + 1] |STFT|^2, centered frames (reflect padding), periodic Hann."""
  padded = np.pad(audio, n_fft // 2, mode="reflect")
  frames = 1 + (len(padded) - n_fft) // hop
  window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
  starts = hop * np.arange(frames)
  framed_TxN = padded[starts[:, None] + np.arange(n_fft)] * window
  return np.abs(np.fft.rfft(framed_TxN, axis=-1)) ** 2


def log_mel(audio: np.ndarray, n_mels: int = 80, chunk_seconds: int = 30,
            filters: np.ndarray | None = None) -> np.ndarray:
  """float32 [chunk_seconds * 100, n_mels] Whisper features of a 16 kHz mono waveform (see the
  module docstring; the waveform is zero-padded or truncated to chunk_seconds)."""
  if n_mels not in MEL_BINS:
    raise ValueError(f"n_mels={n_mels}: Whisper's features have {' or '.join(map(str, MEL_BINS))} "
                     "mel bins")
  n_samples = chunk_seconds * SAMPLING_RATE
  audio = np.asarray(audio, np.float32)[:n_samples].astype(np.float64)
  audio = np.pad(audio, (0, n_samples - len(audio)))
  power_TxF = _power_spectrogram(audio, N_FFT, HOP_LENGTH)[:-1]  # Whisper drops the last frame
  filters = mel_filters(n_mels) if filters is None else filters
  log_TxM = np.log10(np.maximum(power_TxF @ filters, MEL_FLOOR))
  log_TxM = np.maximum(log_TxM, log_TxM.max() - DYNAMIC_RANGE)
  return ((log_TxM + 4.0) / 4.0).astype(np.float32)

