"""Training data: an ImageNet-layout folder or a fixed synthetic batch, sharded across workers.

Layout: DATA/train/<class>/**/<image> and, optionally, DATA/val/<class>/**/<image>. Class folders may
nest sub-folders; names may hold spaces and any unicode. Images may be RGB, grayscale, CMYK, RGBA or
palette images: all are converted to RGB. Files whose names start with "." are ignored (.DS_Store).

A corrupt image is an error that names the file (it is never skipped silently): `verify_images`
decodes every image before training starts, and a file that fails later to decode stops the run
with the same message.
"""

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

from trainer.errors import UsageError

IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".pbm", ".gif", ".tif", ".tiff", ".webp"}
)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Split:
    """The images of one split: (path, class index) pairs and the class names, sorted."""

    classes: list[str]
    samples: list[tuple[str, int]]


def index_folder(data_dir: Path) -> tuple[Split, Split | None]:
    """Index DATA/train and DATA/val, checking the layout; val is None when absent."""
    if not data_dir.is_dir():
        raise UsageError(
            f"data folder {data_dir} does not exist; point --data at a folder holding train/<class>/ images"
        )
    train_dir = data_dir / "train"
    if not train_dir.is_dir() or not _class_dirs(train_dir):
        raise UsageError(
            f"data folder {data_dir} is empty or has no train/<class>/ folders; "
            "lay it out as train/<class>/<image> (and val/<class>/<image>)"
        )
    train = index_split(train_dir, None)
    val_dir = data_dir / "val"
    if val_dir.is_dir() and not _class_dirs(val_dir):
        raise UsageError(f"{val_dir} has no class folders; add val/<class>/ images or remove val/")
    val = index_split(val_dir, train.classes) if val_dir.is_dir() else None
    return train, val


def check_batch_fits(batch_size: int, workers: int, images: int) -> None:
    """Every worker needs at least one full batch per epoch."""
    if batch_size * workers > images:
        raise UsageError(
            f"--batch-size {batch_size} x {workers} workers is more than the {images} training images; "
            "lower --batch-size"
        )


def index_split(split_dir: Path, classes: list[str] | None) -> Split:
    """List one split's images; `classes` (from train) fixes the label of each class folder."""
    found = [d.name for d in _class_dirs(split_dir)]
    classes = classes if classes is not None else found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise UsageError(
            f"{split_dir} has class folders that train/ lacks: {', '.join(unknown[:5])}; "
            "add them to train/ or remove them"
        )
    samples = []
    for name in found:
        files = _image_files(split_dir / name)
        if not files:
            raise UsageError(f"class folder {split_dir / name} has no images; add images or remove the folder")
        samples += [(str(f), classes.index(name)) for f in files]
    return Split(classes=classes, samples=samples)


def _class_dirs(split_dir: Path) -> list[Path]:
    return sorted(d for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))


def _image_files(class_dir: Path) -> list[Path]:
    """Every image under a class folder, recursively; anything else that is not hidden is an error."""
    files = []
    for root, dirs, names in os.walk(class_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            path = Path(root, name)
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise UsageError(f"{path} is not an image file; remove it or move it out of the data folder")
            if not os.access(path, os.R_OK):
                raise UsageError(f"cannot read {path} (permission denied); fix its permissions or remove it")
            files.append(path)
    return files


def load_rgb(path: str) -> Image.Image:
    """Decode an image as RGB, whatever its mode; a corrupt file is a UsageError naming it."""
    try:
        with Image.open(path) as img:
            if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
                img = img.convert("RGBA")
            elif img.mode.startswith("I") or img.mode == "F":
                img = _to_8_bit(img)
            return img.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise UsageError(f"cannot decode image {path} ({exc}); replace or remove the file") from None


def _to_8_bit(img: Image.Image) -> Image.Image:
    """16-bit and float grayscale to 8 bits (PIL's own conversion clips everything above 255)."""
    pixels = np.asarray(img, dtype=np.float32)
    peak = 65535.0 if img.mode.startswith("I;16") or pixels.max() > 255 else 255.0
    return Image.fromarray(np.clip(pixels * (255.0 / peak), 0, 255).astype(np.uint8), mode="L")


def verify_images(samples: list[tuple[str, int]], rank: int = 0, world_size: int = 1) -> int:
    """Decode this worker's share of the images; returns how many were checked."""
    mine = samples[rank::world_size]
    for path, _ in mine:
        load_rgb(path)
    return len(mine)


class ImageFiles(Dataset):
    """Images from a `Split`, decoded to RGB and transformed."""

    def __init__(self, split: Split, transform):
        self.samples, self.transform = split.samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, target = self.samples[i]
        return self.transform(load_rgb(path)), target


def train_transform(size: int, min_crop_scale: float, hflip: bool):
    """Standard ImageNet augmentation: random-resized crop, optional horizontal flip, normalise."""
    steps = [transforms.RandomResizedCrop(size, scale=(min_crop_scale, 1.0))]
    steps += [transforms.RandomHorizontalFlip()] if hflip else []
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


def val_transform(size: int):
    """Resize to size/0.875 and centre-crop, as in the ImageNet reference evaluation."""
    return transforms.Compose([
        transforms.Resize(round(size / 0.875)),
        transforms.CenterCrop(size),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can skip the samples a resumed epoch has already trained on."""

    skip = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


class ShardSampler(Sampler):
    """Every world_size-th index from `rank`: each sample is seen once in all, with no padding."""

    def __init__(self, n: int, rank: int, world_size: int):
        self.indices = list(range(rank, n, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def make_loader(dataset, batch_size: int, sampler, workers: int, pin_memory: bool, drop_last: bool):
    """A DataLoader over one worker's shard."""
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
        pin_memory=pin_memory, drop_last=drop_last, persistent_workers=workers > 0,
    )


class SyntheticBatches:
    """The same random batch `steps` times, as in Horovod's synthetic benchmark: no I/O, no decode."""

    def __init__(self, batch_size: int, image_size: int, num_classes: int, steps: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        self.targets = torch.randint(0, num_classes, (batch_size,), generator=gen)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return itertools.repeat((self.images, self.targets), self.steps)
