"""Photo-like JPEGs sized as ImageNet's training photographs: what the loader, staging and GPU benchmarks decode.

Pure numpy and Pillow (no other module of the project, nothing of the orchestrator's packages), so that the device
check (benchmarks/device_check.py) writes them on a lent GPU machine, which has only torch, torchvision, Pillow and
numpy; sample_data.py's write_photo_sized makes data set folders of them.
"""

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

PHOTO_SIZE, PHOTO_QUALITY, PHOTO_NOISE = (500, 375), 90, 24.0  # ImageNet's typical shape; the noise makes ~110 KB

# The longer sides of ImageNet-1k's training photographs, as write_photo_sized draws them. No per-image table of
# them was found to cite, so this distribution is assumed, from what is well known of the set: most photographs
# were stored 500 px on their longer side (Flickr's "medium" size, hence the usual 500x375), some are smaller, and
# a tail is larger, up to a few thousand px. It is checked against the one aggregate found, the training set's
# 1,281,167 files in 138 GB (PaddlePaddle/models#1633): ~108 KB a file. These photographs average 110-125 KB
# (tests/unit/infra/data/test_sample_data_sizes.py). FFCV stores ImageNet for ResNet-50 at 500 px
# (libffcv/ffcv-imagenet, write_imagenet.sh: max_resolution 500, quality 90): shrinking touches the tail only.
LONGER_SIDES = ((0.23, 150, 499), (0.75, 500, 500), (0.02, 501, 3000))  # share, smallest, largest (log-uniform)
ASPECTS = ((0.6, 3 / 4), (0.2, 2 / 3), (0.1, 1.0), (0.1, 9 / 16))  # share, shorter side / longer side
PORTRAIT = 0.2  # the share of photographs taller than wide


def photo(rng: np.random.Generator, size: tuple[int, int] = PHOTO_SIZE) -> Image.Image:
    """Smooth colour fields at two scales with grain on top: the spectrum of a photograph, roughly."""
    w, h = size
    layers = [
        np.asarray(
            Image.fromarray(rng.integers(0, 256, (rows, cols, 3), dtype=np.uint8)).resize(
                (w, h), Image.Resampling.BICUBIC
            ),
            dtype=np.float32,
        )
        for rows, cols in ((6, 8), (48, 64))
    ]
    pixels = 0.7 * layers[0] + 0.3 * layers[1] + rng.normal(0, PHOTO_NOISE, (h, w, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def photo_sizes(files: int, seed: int = 0) -> list[tuple[int, int]]:
    """Width and height of each of `files` photographs: longer sides at evenly spaced quantiles of LONGER_SIDES (any
    count keeps its shares to a file), in an order drawn by `seed`, as are the aspect and orientation of each."""
    rng = np.random.default_rng(seed)
    longer = [_longer_side((k + 0.5) / files) for k in rng.permutation(files)]
    aspects = rng.choice([aspect for _, aspect in ASPECTS], size=files, p=[share for share, _ in ASPECTS])
    portrait = rng.random(files) < PORTRAIT
    sizes = [(side, max(1, round(side * aspect))) for side, aspect in zip(longer, aspects, strict=True)]
    return [(h, w) if tall else (w, h) for (w, h), tall in zip(sizes, portrait, strict=True)]


def _longer_side(quantile: float) -> int:
    """The longer side at `quantile` (0 to 1) of LONGER_SIDES: log-uniform within each range."""
    for share, low, high in LONGER_SIDES:
        if quantile < share:
            return round(low * (high / low) ** (quantile / share))
        quantile -= share
    return LONGER_SIDES[-1][2]


class Photo(NamedTuple):
    """One photograph of a photo-sized set: its number, where it goes, its width and height."""

    number: int
    split: str
    wnid: str
    size: tuple[int, int]


def photo_plan(files: int, classes: int, seed: int = 0, val_files: int = 0) -> list[Photo]:
    """The photographs of a photo-sized set: `files` in train/ and `val_files` in val/, dealt to `classes` folders."""
    return [
        Photo(i, "train" if i < files else "val", f"n{i % classes:08d}", size)
        for i, size in enumerate(photo_sizes(files + val_files, seed))
    ]


def make_photo_folders(root: Path, photos: list[Photo]) -> None:
    """The split and class folders under `root` that `photos` go to."""
    for split, wnid in {(p.split, p.wnid) for p in photos}:
        (root / split / wnid).mkdir(parents=True, exist_ok=True)


def write_photo(root: str, seed: int, one: Photo) -> int:
    """Write one photograph under `root` (its folder made), drawn from its own generator (seed, number): the same
    bytes in any process; its size in bytes."""
    path = os.path.join(root, one.split, one.wnid, f"img_{one.number:07d}.JPEG")
    photo(np.random.default_rng([seed, one.number]), one.size).save(path, quality=PHOTO_QUALITY)
    return os.path.getsize(path)
