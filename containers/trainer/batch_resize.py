"""--loader gpu's last step on a GPU, for a whole batch in one kernel: each decoded image's region cut, resized with
antialiasing, maybe mirrored, into one uint8 batch laid out channels-last, reading every image where it lies.

The arithmetic is torch's antialiased bilinear resize (`_upsample_bilinear2d_aa`, the one torchvision's v2 resize
calls, and PIL's): output pixel i of a dimension samples the input around centre = scale * (i + shift + 0.5), with
the triangle filter widened by the scale when shrinking (support = max(scale, 1)), over the input pixels from
int(centre - support + 0.5) (at least 0) to int(centre + support + 0.5) (at most the region's size), the weights
normalised to sum to 1. Torch rounds its separable passes to uint8 in between on the CPU; this kernel sums both
dimensions at once in float32 and rounds once, so its pixels are within a level or two of torch's
(tests/unit/trainer/test_batch_resize.py, with Triton's interpreter on the CPU).

A region says which pixels of a decoded image a batch entry is made of:
- training (`crop_region`): the crop box the workers drew, resized to size x size (scale = box / size);
- evaluation (`centre_region`): the whole image resized so that its shorter side is the validation size, then the
  centre size x size of that (the fast loader's Resize and CenterCrop; scale = image / resized, shift = the crop's
  offset in the resized image).

Triton is imported when the kernel is first used (with torch's CUDA builds; the CPU path never needs it).
"""

from itertools import accumulate
from typing import NamedTuple

import torch

from trainer.recipe import val_resize


class Region(NamedTuple):
    """Where a batch entry's pixels come from in its decoded image, and how they are resized."""

    top: int
    left: int
    height: int  # of the region (the crop box, or the whole image)
    width: int
    scale_y: float  # input pixels per output pixel
    scale_x: float
    shift_y: int  # the output's first row in the resized region (a centre crop's offset), else 0
    shift_x: int
    flip: bool


Box = tuple[int, int, int, int] | None  # a crop's top, left, height, width; None: the whole image


def crop_region(box: Box, height: int, width: int, flip: bool, size: int) -> Region:
    """A training sample: the crop box (None: the whole image, one the worker cropped already) resized to size x
    size, mirrored if `flip`."""
    top, left, h, w = box or (0, 0, height, width)
    return Region(top, left, h, w, h / size, w / size, 0, 0, flip)


def centre_region(box: Box, height: int, width: int, flip: bool, size: int) -> Region:
    """An evaluation sample (no box, no flip): the whole image resized so that its shorter side is val_resize(size)
    (the longer one in proportion, as torchvision's Resize computes it), then its centre size x size (CenterCrop's
    offsets)."""
    short, long = sorted((height, width))
    new_short, new_long = val_resize(size), int(val_resize(size) * long / short)
    new_h, new_w = (new_long, new_short) if width <= height else (new_short, new_long)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return Region(0, 0, height, width, height / new_h, width / new_w, top, left, False)


def resize_batch(images: list[torch.Tensor], regions: list[Region], size: int) -> torch.Tensor:
    """The batch (uint8, N x 3 x size x size, channels-last in memory) of `images` (uint8 3 x H x W, on one device)
    cut, resized and flipped as `regions` say: one copy of the images into one buffer, one kernel."""
    device = images[0].device
    pixels = torch.cat([image.reshape(-1) for image in images])
    starts = [0, *accumulate(image.numel() for image in images)][:-1]
    meta = torch.tensor(
        [
            [start, image.shape[-2], image.shape[-1], r.top, r.left, r.height, r.width, int(r.flip)]
            for start, image, r in zip(starts, images, regions)
        ],
        dtype=torch.int64,
    ).to(device, non_blocking=True)
    geometry = torch.tensor([[r.scale_y, r.scale_x, r.shift_y, r.shift_x] for r in regions], dtype=torch.float32).to(
        device, non_blocking=True
    )
    from trainer.resize_kernel import BLOCK, resize  # Triton, on first use

    out = torch.empty(len(images), size, size, 3, dtype=torch.uint8, device=device)
    resize[(len(images), -(-size * size // BLOCK))](
        pixels,
        meta,
        geometry,
        out,
        size,
        BLOCK=BLOCK,
    )
    return out.permute(0, 3, 1, 2)
