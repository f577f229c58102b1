"""Training data: an ImageNet-layout folder (see layout.py) or a fixed synthetic batch, sharded across workers.

Images that cannot be decoded are found once per run, before training (`known_bad_images`, in badfiles.py): from
DATA/.verified.json when the data version carries one (nothing decoded), else by decoding (--verify-images:
the preflight all of them, or each worker its share, the lists combined), else from the preflight's list in
OUT. --bad-files fail refuses them in one line; skip trains without them and says so. A file that fails
later to decode (nothing checked it) stops the run with a message naming it.

Four loaders (--loader), the same crops and the same sampler order: fast (the default) draws each training crop
from the JPEG's header and decodes only that rectangle (jpeg_crop.py: libjpeg-turbo's partial decoding, the pixels
of a whole decode), straight to uint8 tensors, resizes and flips them there and batches uint8 in the channels-last
memory it decodes them in (`stack_channels_last`: the stacking a plain copy), normalised on the device (`normalise`,
in the step);
pil is the original path (PIL images, normalised floats made in the loader); gpu has the workers read the files and
draw the fast loader's crops and flips (`CropFirst.encode`), and a thread of the training process decode them on
the device (gpu_decode.py); dali hands the files to NVIDIA DALI (dali.py). `trainflow bench loader` measures them.
"""

import itertools
import math
from collections.abc import Iterator
from functools import partial

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2
from torchvision.transforms.functional import pil_to_tensor

from nodelib.image_files import (  # the data API: the decoding, used here or by train.py and the tests
    load_rgb,
    opened,
    verify_images,  # noqa: F401 - part of the data API
)
from nodelib.layout import (  # the data API: the layout's names, used here or by train.py and the tests
    Split,
    index_folder,  # noqa: F401 - part of the data API
)
from trainer import dali, gpu_decode, jpeg_crop
from trainer.badfiles import (  # noqa: F401 - the bad-file rules, torch-free (every trainer's), part of the data API
    BAD_LIST,
    CHECKED,
    DECODED,
    bad_files_entry,
    bad_list_path,
    folder_identity,
    hand_to_workers,
    known_bad_images,
    skip_bad_images,
    still_here,
)
from trainer.batch_resize import centre_region, crop_region
from trainer.options import LOADERS, check_batch_fits  # noqa: F401 - the loaders the data API builds, its rule
from trainer.recipe import MEAN, RATIO, STD, val_resize

CPU = torch.device("cpu")  # the default device of the batch makers


class ImageFiles(Dataset):
    """Images from a `Split`, decoded (`decode`: a PIL image, or a uint8 tensor for the fast loader) and transformed;
    `collate` makes a batch of them (None: torch's default_collate)."""

    def __init__(self, split: Split, transform, decode=load_rgb, collate=None):
        self.samples, self.transform, self.decode, self.collate = split.samples, transform, decode, collate

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, target = self.samples[i]
        return self.transform(self.decode(path)), target


def image_files(split: Split, transform, loader: str) -> ImageFiles:
    """A split as the `loader` (--loader) reads it: decoded by PIL, or (fast) straight to uint8 tensors; DALI
    decodes its own (make_loader hands it the files)."""
    if isinstance(transform, CropFirst):  # it decodes only the crop (`crop`), then resizes and flips it (`finish`)
        return ImageFiles(split, transform.finish, transform.crop, stack_channels_last)
    if isinstance(transform, gpu_decode.DeviceSteps):  # the workers only read and draw (`encode`); see make_loader
        return ImageFiles(split, transform, transform.encode)
    if loader == "fast":
        return ImageFiles(split, transform, read_uint8, stack_channels_last)
    return ImageFiles(split, transform, {"pil": load_rgb}.get(loader))


def stack_channels_last(samples: list) -> list:
    """The fast loader's batch: default_collate of (image, target) samples, the uint8 images (3, H, W) stacked in
    channels-last memory (N, H, W, 3), the layout they are decoded and resized in: stacking them is a plain copy,
    where a contiguous batch would transpose every image (measured: 0.09 ms per image on one core against 0.03).
    The batch is still (N, 3, H, W); normalise lays it out as the model wants, in the same pass."""
    images, *rest = default_collate([(image.permute(1, 2, 0), *others) for image, *others in samples])
    return [images.permute(0, 3, 1, 2), *rest]


def read_uint8(path: str) -> torch.Tensor:
    """An image file as an RGB uint8 CHW tensor: a JPEG decoded by libjpeg-turbo straight into the tensor (no PIL
    image, no floats; measured faster than PIL's decode), anything else (PNG, CMYK, palettes, 16 bits) through
    load_rgb. PIL reads the header first: the format, and the guard against decompression bombs."""
    with opened(path) as img:
        jpeg = img.format == "JPEG" and img.mode in ("RGB", "L")
    if jpeg:
        try:
            return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
        except RuntimeError:
            pass  # a JPEG torchvision refuses (truncated, say): PIL decodes it, or names what is wrong with it
    return pil_to_tensor(load_rgb(path))


def train_transform(size: int, min_crop_scale: float, hflip: bool, loader: str = "pil"):
    """Standard ImageNet augmentation: random-resized crop, optional horizontal flip, normalise (the fast loader's
    uint8 tensors are normalised later, on the device, by `normalise`)."""
    if loader == "dali":
        return dali.TrainSteps(size, min_crop_scale, hflip)
    if loader == "fast":
        return CropFirst(size, min_crop_scale, hflip)
    if loader == "gpu":  # the fast loader's draws, in the workers; decoded, cropped, resized and flipped on the device
        crops = CropFirst(size, min_crop_scale, hflip)
        return gpu_decode.DeviceSteps(crops.encode, crops.resize, read_uint8, partial(crop_region, size=size), size)
    steps = [transforms.RandomResizedCrop(size, scale=(min_crop_scale, 1.0))]
    return transforms.Compose(steps + ([transforms.RandomHorizontalFlip()] if hflip else []) + to_floats(loader))


LOG_RATIO = torch.log(torch.tensor(RATIO)).tolist()


def crop_box(width: int, height: int, scale: tuple[float, float]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random-resized crop of a `width` x `height` image, drawn as torchvision's
    RandomResizedCrop draws it (the same random numbers from torch's generator, in the same order, so one seed gives
    every loader the same crops): up to 10 tries of an area (a uniform share of the image's, within `scale`) and an
    aspect ratio (log-uniform within 3/4 to 4/3) that fit, else the centre crop nearest that range."""
    area = width * height
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(LOG_RATIO[0], LOG_RATIO[1])).item()
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            return top, int(torch.randint(0, width - w + 1, size=(1,)).item()), h, w
    if width / height < min(RATIO):
        w, h = width, int(round(width / min(RATIO)))
    elif width / height > max(RATIO):
        w, h = int(round(height * max(RATIO))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class CropFirst:
    """The fast loader's training augmentation: a random-resized crop, resized, maybe flipped. `load(path)` draws the
    crop from the JPEG's header and decodes only it (`crop`, through jpeg_crop; image_files makes `crop` the data
    set's decode and `finish` its transform); images that are not RGB or gray
    JPEGs, and every image where partial decoding is unavailable, are decoded whole and cropped, as `__call__` does
    to a decoded uint8 tensor. --loader gpu draws the same crops and flips in its workers (`encode`) and does the
    rest on the device (gpu_decode.py)."""

    def __init__(self, size: int, min_crop_scale: float, hflip: bool):
        self.size, self.scale, self.hflip = size, (min_crop_scale, 1.0), hflip

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.finish(self.cut(image))

    def load(self, path: str) -> torch.Tensor:
        return self.finish(self.crop(path))

    def cut(self, image: torch.Tensor) -> torch.Tensor:
        top, left, h, w = crop_box(image.shape[-1], image.shape[-2], self.scale)
        return image[..., top : top + h, left : left + w]

    def crop(self, path: str) -> torch.Tensor:
        """The crop of the image at `path`, decoded, not yet resized."""
        content = read_jpeg(path) if jpeg_crop.library() else b""
        if box := self.draw_box(content):
            try:
                return jpeg_crop.decode_crop(content, *box)
            except (jpeg_crop.JpegError, ValueError):  # refused, or a header libjpeg reads otherwise than info
                pass
        return self.cut(read_uint8(path))

    def encode(self, path: str) -> gpu_decode.Encoded:
        """--loader gpu's work in a loader worker: the file's bytes, and the crop and flip drawn as `crop` and
        `finish` draw them (one seed, the fast loader's crops); an image the device's decoder cannot take (see
        decodable) is decoded here, as `crop` decodes it, and cropped. Nothing here touches the device."""
        content = read_jpeg(path)
        box = self.draw_box(content)
        image = content if box else self.cut(read_uint8(path)).contiguous()  # only the crop travels
        return gpu_decode.Encoded(image, box, self.draw_flip(), path)

    def draw_box(self, content: bytes) -> tuple[int, int, int, int] | None:
        """The crop (top, left, height, width) of the JPEG `content`, drawn from its header; None, with nothing
        drawn, when it is not a JPEG that this header lets us decode (see decodable)."""
        shape = decodable(content)
        return crop_box(*shape, self.scale) if shape else None

    def resize(self, crop: torch.Tensor) -> torch.Tensor:
        return v2.functional.resize(crop, [self.size, self.size], antialias=True)

    def draw_flip(self) -> bool:
        return self.hflip and bool(torch.rand(1) < 0.5)

    def finish(self, crop: torch.Tensor) -> torch.Tensor:
        crop = self.resize(crop)
        return v2.functional.horizontal_flip(crop) if self.draw_flip() else crop


def decodable(content: bytes) -> tuple[int, int] | None:
    """(width, height) of the JPEG `content` when a JPEG decoder takes it straight to RGB: gray or colour (CMYK and
    YCCK, 4 components, are PIL's to convert), with its end marker (without it a file was cut short: a crop above the
    cut would decode, one below it not, so whether training stops would depend on the draw), and no more pixels than
    PIL's guard against decompression bombs allows. None otherwise: read_uint8 decodes it whole, or names what is
    wrong with it."""
    shape = jpeg_crop.header_shape(content) if content else None  # width, height, components; None: not a JPEG
    if shape and shape[2] in jpeg_crop.TO_RGB and content.endswith(b"\xff\xd9") and not too_many_pixels(*shape[:2]):
        return shape[0], shape[1]
    return None


def encode_whole(path: str) -> gpu_decode.Encoded:
    """--loader gpu's work in a loader worker for evaluation: the file's bytes, or (an image the device's decoder
    cannot take, see decodable) the image decoded here, whole; no crop, no flip."""
    content = read_jpeg(path)
    return gpu_decode.Encoded(content if decodable(content) else read_uint8(path), None, False, path)


def without_restart_markers(split: Split, sample: int = 32) -> tuple[int, int]:
    """Of up to `sample` JPEGs spread over the split, how many lack the restart markers that let the fast loader
    decode only a crop's MCUs (jpeg_crop.cuttable), and how many JPEGs were sampled."""
    jpegs = [
        content
        for path, _ in split.samples[:: max(len(split.samples) // sample, 1)][:sample]
        if jpeg_crop.info(content := read_jpeg(path))
    ]
    return sum(not jpeg_crop.cuttable(content) for content in jpegs), len(jpegs)


def read_jpeg(path: str) -> bytes:
    """The file's bytes when it starts as a JPEG does (SOI), else b"" (PNGs and the rest are read once, by PIL; a
    file that cannot be read too: read_uint8 names it and why)."""
    try:
        with open(path, "rb", buffering=0) as file:  # unbuffered: the bytes read once into one object, not copied
            if file.read(2) != b"\xff\xd8":
                return b""
            file.seek(0)
            return file.readall()
    except OSError:
        return b""


def too_many_pixels(width: int, height: int) -> bool:
    """More pixels than PIL decodes without its decompression-bomb warning (which `opened` makes an error)."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS is not None and width * height > Image.MAX_IMAGE_PIXELS


def val_transform(size: int, loader: str = "pil"):
    """Resize to size/0.875 and centre-crop, as in the ImageNet reference evaluation: deterministic."""
    if loader == "dali":
        return dali.ValSteps(size)
    if loader == "gpu":  # the fast loader's evaluation, applied on the device to each whole decoded image
        fast = val_transform(size, "fast")
        return gpu_decode.DeviceSteps(encode_whole, fast, read_uint8, partial(centre_region, size=size), size)
    t = kind(loader)
    return t.Compose([t.Resize(val_resize(size)), t.CenterCrop(size), *to_floats(loader)])


def kind(loader: str):
    """The transforms of `loader`: torchvision's v2 for the fast loader's uint8 tensors (they resize uint8 natively,
    with antialiasing; v1 goes through floats and back, measured slower than PIL), v1 for PIL images."""
    return v2 if loader == "fast" else transforms


def to_floats(loader: str) -> list:
    """The PIL loader's last steps: to a float tensor, normalised; none for the fast loader (the device does it)."""
    return [] if loader == "fast" else [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]


# (x / 255 - mean) / std = x * SCALE + SHIFT, channel by channel, in float32 arithmetic as torch computed them
# before 2026-11-27 (the same floats to the last bit: a run's numbers do not move)
SCALE, SHIFT = 1 / (255 * torch.tensor(STD)), -torch.tensor(MEAN) / torch.tensor(STD)


def normalise(images: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """A batch of uint8 images (the fast loader's), wherever it is, as normalised floats in `memory_format`: what
    ToTensor and Normalize do to each image of the PIL loader; float batches are only laid out so. On the CPU, a
    channels-last uint8 batch (stack_channels_last's) is made floats in one pass by jpeg_crop's C loop (the same
    floats: tests/unit/trainer/test_data.py); elsewhere torch's three (to floats, multiply, add)."""
    if images.dtype != torch.uint8:
        return images.contiguous(memory_format=memory_format)
    scale, shift = SCALE.to(images.device), SHIFT.to(images.device)
    if in_one_pass(images, memory_format):
        return jpeg_crop.normalise(images, scale, shift, planar=memory_format == torch.contiguous_format)
    floats = images.to(torch.float32, memory_format=memory_format)
    return floats.mul_(scale.view(1, -1, 1, 1)).add_(shift.view(1, -1, 1, 1))


def in_one_pass(images: torch.Tensor, memory_format: torch.memory_format) -> bool:
    """Whether jpeg_crop's C loop normalises this uint8 batch: on the CPU, RGB in channels-last memory, to floats
    contiguous or channels-last, with the library built."""
    return (
        images.device.type == "cpu"
        and images.ndim == 4
        and images.shape[1] == 3
        and images.permute(0, 2, 3, 1).is_contiguous()
        and memory_format in (torch.contiguous_format, torch.channels_last)
        and jpeg_crop.library() is not None
    )


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


def make_loader(
    dataset,
    batch_size: int,
    sampler,
    workers: int,
    pin_memory: bool,
    drop_last: bool,
    device: torch.device = CPU,
):
    """A DataLoader over one worker's shard; with --loader dali, DALI's batches in the sampler's order (`workers` its
    threads, on `device`); with --loader gpu, the DataLoader's encoded batches decoded on `device` by a thread."""
    if isinstance(dataset.transform, (dali.TrainSteps, dali.ValSteps)):
        return dali.DaliBatches(dataset.samples, sampler, batch_size, dataset.transform, device, workers, drop_last)
    if isinstance(dataset.transform, gpu_decode.DeviceSteps):  # bytes, not pixels: nothing worth pinning
        loader = data_loader(dataset, batch_size, sampler, workers, False, drop_last, gpu_decode.collate)
        return gpu_decode.DeviceBatches(loader, dataset.transform, device)
    return data_loader(dataset, batch_size, sampler, workers, pin_memory, drop_last, dataset.collate)


def data_loader(
    dataset, batch_size: int, sampler, workers: int, pin_memory: bool, drop_last: bool, collate=None
) -> DataLoader:
    """torch's DataLoader over `dataset` in the order of `sampler`, its worker processes kept between epochs."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        collate_fn=collate,
        persistent_workers=workers > 0,
    )


class SyntheticBatches:
    """The same random batch `steps` times, as in Horovod's synthetic benchmark: no I/O, no decode, and no copy per
    step: the batch is drawn on the CPU (the same numbers on any device) and kept on the training device in the
    model's memory format, so moving it there each step moves nothing."""

    def __init__(
        self,
        batch_size: int,
        image_size: int,
        num_classes: int,
        steps: int,
        seed: int,
        device: torch.device = CPU,
        channels_last: bool = False,
    ):
        gen = torch.Generator().manual_seed(seed)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.images = torch.randn(batch_size, 3, image_size, image_size, generator=gen).to(device, memory_format=fmt)
        self.targets = torch.randint(0, num_classes, (batch_size,), generator=gen).to(device)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return itertools.repeat((self.images, self.targets), self.steps)
