"""A small real data set written to disk: scikit-learn's bundled 8x8 digits as ImageNet-layout PNGs."""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image


# Training settings that fit the digits set (32x32 PNGs, 1,438 training images): ResNet-18 for 8 epochs, about
# 2 minutes on 2 CPU cores. The flow uses them, under the user's own settings, when no data is named.
DIGITS_TRAINING = dict(model="resnet18", epochs=8, batch_size=32, lr=0.02, warmup_epochs=1, image_size=32,
                       min_crop_scale=0.5, hflip=False, loader_workers=1, checkpoint_every=50, log_every=10)


def write_digits(dest: Path, size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> Path:
    """Write dest/train/<digit>/*.png and dest/val/<digit>/*.png once; an existing copy is kept.

    The folder appears whole or not at all: it is written under a temporary name, then renamed.
    """
    if (dest / "train").is_dir() and (dest / "val").is_dir():
        return dest
    from sklearn.datasets import load_digits  # ships its data: nothing is downloaded

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    n_val = int(len(order) * val_fraction)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for position, index in enumerate(order):
            split = "val" if position < n_val else "train"
            pixels = (digits.images[index] * (255 / 16)).astype(np.uint8)
            image = Image.fromarray(pixels, mode="L").resize((size, size), Image.Resampling.BILINEAR)
            folder = tmp / split / str(digits.target[index])
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{index:04d}.png")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def write_imagenet_like(dest: Path, files: int = 5000, classes: int = 100, kb: int = 110, seed: int = 0) -> Path:
    """An ImageNet-shaped folder of random JPEGs of about `kb` KB (90% train, 10% val), written once."""
    if (dest / "train").is_dir():
        return dest
    rng = np.random.default_rng(seed)
    side = _side_for(kb, rng)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for i in range(files):
            split = "val" if (i // classes) % 10 == 9 else "train"
            folder = tmp / split / f"n{i % classes:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i:07d}.JPEG", quality=85)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _side_for(kb: int, rng: np.random.Generator) -> int:
    """The side of a square noise JPEG (quality 85) that weighs about `kb` KB."""
    import io

    probe = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(probe, "JPEG", quality=85)
    return max(8, round(200 * (kb * 1024 / len(probe.getvalue())) ** 0.5))
