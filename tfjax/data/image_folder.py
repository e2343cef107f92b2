"""An image folder: one subfolder per class, holding that class's PNG / JPEG images.

    DIR/CLASS_A/*.png|*.jpg|*.jpeg
    DIR/CLASS_B/...

Labels are the classes' indices in sorted subfolder-name order (the names are kept in the
manifest, so training and evaluation can report them); images are taken in sorted path order
within each class. Files of other types and hidden entries are skipped (and counted). Each image
is read with Pillow, turned upright by its EXIF orientation, converted to RGB (or L), its shorter
side resized to `size` (bicubic) and center-cropped to size x size; an image already size x size
is kept pixel for pixel.
"""

from __future__ import annotations

import os

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MODES = {"RGB": 3, "L": 1}


def _pillow():
  try:
    from PIL import Image, ImageOps  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("image folders are read with Pillow: pip install 'tfjax[vision]'") from None
  return Image, ImageOps


def _is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith(".")


def find_images(directory: str) -> tuple[list[str], list[tuple[str, int]], int]:
  """(class names, [(image path, label)], skipped files) of an image folder; one-line errors for
  a missing or empty folder, images outside a class folder, and a class folder with no image."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"--input=images:{directory}: no such directory")
  entries = sorted(e for e in os.listdir(directory) if not e.startswith("."))
  classes = [e for e in entries if os.path.isdir(os.path.join(directory, e))]
  loose = [e for e in entries if _is_image(e)]
  if loose:
    raise ValueError(f"--input=images:{directory}: {os.path.join(directory, loose[0])} is not in "
                     "a class folder; an image folder holds one subfolder per class, each with "
                     "that class's images")
  if not classes:
    raise ValueError(f"--input=images:{directory} holds no class subfolder (an image folder holds "
                     "one subfolder per class, each with that class's PNG/JPEG images)")
  images, skipped = [], 0
  for label, name in enumerate(classes):
    found = []
    for root, dirs, files in os.walk(os.path.join(directory, name)):
      dirs[:] = sorted(d for d in dirs if not d.startswith("."))
      for file in sorted(files):
        if _is_image(file):
          found.append(os.path.join(root, file))
        else:
          skipped += 1
    if not found:
      raise ValueError(f"{os.path.join(directory, name)}: class folder holds no PNG/JPEG image "
                       "(add its images or remove the folder)")
    images += [(path, label) for path in sorted(found)]
  return classes, images, skipped


def load_image(path: str, size: int, mode: str = "RGB") -> np.ndarray:
  """uint8 [size, size, channels] pixels of one image (module docstring)."""
  Image, ImageOps = _pillow()
  try:
    with Image.open(path) as image:
      image = ImageOps.exif_transpose(image).convert(mode)
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
    raise ValueError(f"{path}: not a readable image ({type(e).__name__}: {e}); replace or "
                     "remove it") from None
  width, height = image.size
  if (width, height) != (size, size):
    scale = size / min(width, height)
    resized = (max(size, round(width * scale)), max(size, round(height * scale)))
    image = image.resize(resized, Image.Resampling.BICUBIC)
    left, top = (resized[0] - size) // 2, (resized[1] - size) // 2
    image = image.crop((left, top, left + size, top + size))
  return np.asarray(image, np.uint8).reshape(size, size, MODES[mode])
