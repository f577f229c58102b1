"""Training data: an ImageNet-layout folder (see layout.py) or a fixed synthetic batch, sharded across workers.

A corrupt image is an error that names the file (it is never skipped silently): `verify_images`
decodes every image before training starts, and a file that fails later to decode stops the run
with the same message.
"""

import itertools
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

from trainer.errors import UsageError
from trainer.layout import Split, index_folder, load_rgb, verify_images  # noqa: F401 - the data API

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def check_batch_fits(batch_size: int, workers: int, images: int) -> None:
    """Every worker needs at least one full batch per epoch."""
    if batch_size * workers > images:
        raise UsageError(
            f"--batch-size {batch_size} x {workers} workers is more than the {images} training images; "
            "lower --batch-size"
        )


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
