"""--loader gpu: the training process decodes the JPEGs on its device, a batch at a time, in a thread of its own.

The DataLoader's worker processes (forked) only read each file's bytes and draw its crop and flip as the fast loader
draws them (data.CropFirst.encode: the crop box from the JPEG's header, then the flip, so one seed gives both loaders
the same crops); they never touch CUDA. `collate` packs a batch's bytes into one tensor in shared memory, so that only
its handle crosses to the training process. A thread of the training process (`Prefetch`, a couple of batches ahead)
decodes each batch with one call of torchvision's decode_jpeg on the device (nvJPEG, batched, on a GPU). On a GPU one
kernel then cuts, resizes and flips the whole batch (batch_resize.py); with the CPU as the device (how the tests run
it) each image is cropped, resized and flipped as the fast loader does it. The uint8 batch is normalised in the step
(data.normalise), as the fast loader's batches are. Evaluation decodes whole images and applies the fast loader's
resize and centre crop.

What the device's decoder cannot take falls back to the CPU: images that are not RGB or gray JPEGs (PNG, CMYK,
YCCK, ...) are decoded and cropped in the worker (data.read_uint8, the fast loader's path); a batch the device
refuses (a progressive JPEG that nvJPEG does not decode, a corrupt one) is decoded image by image, and an image it
still refuses by read_uint8 on the CPU, which names a file that nothing can decode, as the fast loader does. The
batches follow the trainer's sampler (data.ResumableSampler), so a run resumes where the other loaders would.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg
from torchvision.transforms import v2

from nodelib.errors import UsageError, first_line
from trainer.batch_resize import Box, Region, crop_region, resize_batch
from trainer.jpeg_crop import header_shape


class Encoded(NamedTuple):
    """One sample as a loader worker makes it, and as the decode thread reads it back from a batch."""

    image: bytes | torch.Tensor
    """A JPEG's bytes (in the worker: bytes; from a batch: a 1-D uint8 view of its bytes), for the device to decode;
    or an image the worker decoded (uint8 CHW, already cropped)."""
    box: Box
    """The crop (top, left, height, width) of the decoded JPEG; None: the whole image."""
    flip: bool
    """Whether the crop is mirrored."""
    path: str
    """The file, named when it cannot be decoded."""


def is_jpeg(sample: Encoded) -> bool:
    """Whether the sample is a JPEG's bytes for the device to decode (not an image the worker decoded)."""
    return isinstance(sample.image, bytes) or sample.image.dim() == 1


class EncodedBatch(NamedTuple):
    """A DataLoader's batch for the decode thread: the JPEGs' bytes one after another in one uint8 tensor (in shared
    memory when a worker made it: only its handle is pickled), the images the workers decoded, each sample's draws,
    and the targets."""

    jpegs: torch.Tensor
    lengths: list[int]  # each sample's bytes in `jpegs`; 0: the next of `decoded`
    decoded: list[torch.Tensor]
    boxes: list[Box]
    flips: list[bool]
    paths: list[str]
    targets: torch.Tensor

    @property
    def samples(self) -> list[Encoded]:
        """The batch's samples, each JPEG's bytes a view into `jpegs` (nothing copied)."""
        views = iter(torch.split(self.jpegs, [n for n in self.lengths if n]) if any(self.lengths) else ())
        decoded = iter(self.decoded)
        images = [next(views) if n else next(decoded) for n in self.lengths]
        return [Encoded(*sample) for sample in zip(images, self.boxes, self.flips, self.paths)]


def collate(items: list[tuple[Encoded, int]]) -> EncodedBatch:
    """The DataLoader's collate_fn, in a worker: the JPEGs' bytes copied once, into one tensor (made in shared
    memory in a worker process), the rest as it is."""
    samples = [sample for sample, _ in items]
    contents = [s.image if isinstance(s.image, bytes) else b"" for s in samples]  # a JPEG's bytes are never empty
    lengths = [len(content) for content in contents]
    jpegs = torch.empty(sum(lengths), dtype=torch.uint8)
    if get_worker_info() is not None:
        jpegs.share_memory_()  # filled where it will be read: pickling it then passes only a handle
    packed, at = jpegs.numpy(), 0
    for content, length in zip(contents, lengths):
        packed[at : at + length] = np.frombuffer(content, dtype=np.uint8)
        at += length
    return EncodedBatch(
        jpegs,
        lengths,
        [s.image for s in samples if isinstance(s.image, torch.Tensor)],
        [s.box for s in samples],
        [s.flip for s in samples],
        [s.path for s in samples],
        torch.tensor([target for _, target in items]),
    )


@dataclass(frozen=True)
class DeviceSteps:
    """What --loader gpu does to a sample (data.train_transform and val_transform make them)."""

    encode: Callable[[str], Encoded]
    """In a loader worker: a file to its bytes and draws (data.CropFirst.encode, data.encode_whole)."""
    resize: Callable[[torch.Tensor], torch.Tensor]
    """On the CPU device: a decoded image, after its crop and before its flip, to the model's size."""
    read: Callable[[str], torch.Tensor]
    """On the CPU: a file the device refused, decoded whole (data.read_uint8), or a message naming it."""
    region: Callable[[Box, int, int, bool], Region]
    """On a GPU: the region of a decoded image (box, height, width, flip) that batch_resize makes a batch entry of
    (batch_resize.crop_region, centre_region)."""
    size: int
    """The batch's images' side."""

    def __call__(self, sample: Encoded) -> Encoded:
        """The data set's transform: nothing more in the worker (the decode thread does the rest)."""
        return sample


def check_device(device: torch.device) -> None:
    """Refuse a device that torchvision cannot decode JPEGs on (a torchvision built without nvJPEG, say), or, on a
    GPU, that the batch kernel cannot run on, before any worker starts: a tiny JPEG decoded there and made a batch
    entry, as the batches will be."""
    probe = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
    try:
        images = decode_jpeg([probe], device=device, mode=ImageReadMode.RGB)
    except (RuntimeError, NotImplementedError) as exc:
        raise UsageError(
            f"--loader gpu cannot decode JPEGs on {device} ({first_line(exc)}); install a torchvision built with CUDA "
            "(its nvJPEG decoder), or pass --loader fast"
        ) from None
    if device.type == "cuda":
        check_kernel(images)


def check_kernel(images: list[torch.Tensor]) -> None:
    """Refuse a device the batch kernel cannot run on (no Triton, no C compiler for its launcher, no driver): the
    decoded `images` made a batch. Triton's compile and driver errors are of its own types, hence any Exception."""
    try:
        resize_batch(images, [crop_region(None, 8, 8, False, 8) for _ in images], 8)
    except Exception as exc:
        raise UsageError(
            f"--loader gpu cannot run its batch kernel on {images[0].device} ({first_line(exc)}); install the Triton "
            "that torch's CUDA build requires (pip install triton) and a C compiler (gcc), or pass --loader fast"
        ) from None


def new_tally() -> dict[str, int]:
    """What the decode thread counts (metrics.json's gpu_decoding, rank 0's): the batches, those whose JPEGs the
    device decoded in one call, and the images decoded on the CPU (in the workers, or after the device refused)."""
    return {"batches": 0, "batches_decoded_at_once": 0, "images_decoded_on_cpu": 0}


class DeviceBatches:
    """(uint8 NCHW images on `device`, targets) of a DataLoader's encoded batches, in its sampler's order, decoded
    `ahead` batches ahead of the training step by a thread of this process; `tally` counts how (new_tally)."""

    def __init__(self, loader: DataLoader, steps: DeviceSteps, device: torch.device, ahead: int = 2):
        self.loader, self.steps, self.device, self.ahead = loader, steps, device, ahead
        self.sampler = loader.sampler  # the trainer sets its epoch and what a resumed epoch skips
        self.tally = new_tally()
        self.decoder: Decoder | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(self.loader)  # in this thread: the workers' seeds drawn where the other loaders draw them
        self.decoder = self.decoder or Decoder(self.steps, self.device, self.tally)  # one stream for every epoch
        with Prefetch(map(self.decoder, batches), self.ahead) as ready:
            yield from ready


class Decoder:
    """An EncodedBatch to (images, targets) on `device`; on CUDA on a stream of its own (see __call__)."""

    def __init__(self, steps: DeviceSteps, device: torch.device, tally: dict[str, int] | None = None):
        self.steps, self.device, self.tally = steps, device, new_tally() if tally is None else tally
        cuda = device.type == "cuda"
        self.consumer = torch.cuda.current_stream(device) if cuda else None  # the training step's, read in its thread
        self.stream = torch.cuda.Stream(device) if cuda else None

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        self.tally["batches"] += 1
        if self.stream is None or self.consumer is None:  # both set on CUDA only
            return decode_batch(batch.samples, self.steps, self.device, self.tally), batch.targets
        # A thread starts on GPU 0: without this, leaving the stream's block below would make GPU 0 current (and
        # give every rank a CUDA context there).
        torch.cuda.set_device(self.device)
        # The decode runs on a stream of its own, so it overlaps the training step; the batch is handed over once
        # that stream is done (synchronised here, in the decode thread), and record_stream keeps the allocator from
        # giving the batch's memory to the decoder again while the step still reads it. pytorch/vision#9606: see
        # on_device (each decode_jpeg call first drains the stream it is called on).
        with torch.cuda.stream(self.stream):
            images = decode_batch(batch.samples, self.steps, self.device, self.tally)
        images.record_stream(self.consumer)
        self.stream.synchronize()
        return images, batch.targets


def decode_batch(
    samples: list[Encoded], steps: DeviceSteps, device: torch.device, tally: dict[str, int] | None = None
) -> torch.Tensor:
    """The samples' images on `device`, each decoded, cropped, resized and maybe flipped, as one uint8 batch; a batch
    that runs the device out of memory is a UsageError naming its largest image (out_of_memory)."""
    try:
        return finish_batch(decode_images(samples, steps.read, device, tally), samples, steps, device)
    except RuntimeError as exc:
        if not ran_out_of_memory(exc):
            raise
        raise UsageError(out_of_memory(samples, device)) from None


def ran_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says the device ran out of memory: torch's OutOfMemoryError, or the RuntimeError torchvision's
    batched CUDA decode makes of it ("Error while decoding JPEG images: CUDA out of memory. ...": its
    decode_jpegs_cuda.cpp catches every std::exception and raises its message in a RuntimeError)."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def finish_batch(images: list, samples: list[Encoded], steps: DeviceSteps, device: torch.device) -> torch.Tensor:
    """The decoded images cropped, resized and maybe flipped into one uint8 batch: on a GPU by one kernel for the
    whole batch, on the CPU image by image as the fast loader does."""
    if device.type == "cuda":
        regions = [steps.region(s.box, image.shape[-2], image.shape[-1], s.flip) for image, s in zip(images, samples)]
        return resize_batch(images, regions, steps.size)
    return torch.stack([finish(image, sample, steps.resize) for image, sample in zip(images, samples)])


def finish(image: torch.Tensor, sample: Encoded, resize: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A decoded image cut to the sample's crop box, resized, and flipped if the sample says so."""
    if sample.box:
        top, left, height, width = sample.box
        image = image[..., top : top + height, left : left + width]
    image = resize(image)
    return v2.functional.horizontal_flip(image) if sample.flip else image


def decode_images(
    samples: list[Encoded], read: Callable[[str], torch.Tensor], device: torch.device, tally: dict | None = None
) -> list:
    """Every sample's image on `device`: the JPEGs decoded there together, the images the workers decoded moved
    (counted in `tally`, new_tally's, when given)."""
    jpegs = [sample for sample in samples if is_jpeg(sample)]
    tally = new_tally() if tally is None else tally
    tally["images_decoded_on_cpu"] += len(samples) - len(jpegs)
    decoded = iter(decode_jpegs(jpegs, read, device, tally))
    images = [next(decoded) if is_jpeg(s) else worker_image(s).to(device, non_blocking=True) for s in samples]
    return [image if fits(image, s.box) else redecoded(s, read, device, tally) for image, s in zip(images, samples)]


def fits(image: torch.Tensor, box: Box) -> bool:
    """Whether the crop box a worker drew from the JPEG's header lies inside the decoded image (a decoder that turns
    images by their EXIF orientation, as newer torchvision's nvJPEG path does, swaps their sides)."""
    return box is None or (box[0] + box[2] <= image.shape[-2] and box[1] + box[3] <= image.shape[-1])


def redecoded(sample: Encoded, read: Callable[[str], torch.Tensor], device: torch.device, tally: dict) -> torch.Tensor:
    """A JPEG the device decoded to other sides than its header's, decoded by `read` on the CPU as the fast loader
    decodes it (not turned), so that its crop box lies inside it (counted in `tally`)."""
    tally["images_decoded_on_cpu"] += 1
    image = read(sample.path)
    if not fits(image, sample.box):
        raise ValueError(f"{sample.path}: its crop {sample.box} lies outside the decoded {tuple(image.shape)} image")
    return image.to(device)


def worker_image(sample: Encoded) -> torch.Tensor:
    """The image a worker decoded (decode_images passes only those); TypeError for a JPEG's bytes."""
    if isinstance(sample.image, bytes):
        raise TypeError(f"{sample.path} is a JPEG's bytes, not an image the worker decoded")
    return sample.image


def decode_jpegs(
    jpegs: list[Encoded], read: Callable[[str], torch.Tensor], device: torch.device, tally: dict[str, int]
) -> list:
    """The JPEGs decoded on `device` in one call (nvJPEG's batched decode on a GPU); a batch it refuses is decoded
    one by one, and a JPEG the device still refuses by `read` on the CPU (each counted in `tally`)."""
    if not jpegs:
        return []
    try:
        decoded = on_device([jpeg_data(s) for s in jpegs], device)
        tally["batches_decoded_at_once"] += 1
        return decoded
    except RuntimeError as exc:
        if ran_out_of_memory(exc):  # decode_batch says which image: one by one would not fit either
            raise
        return [decode_one(sample, read, device, tally) for sample in jpegs]


def out_of_memory(samples: list[Encoded], device: torch.device) -> str:
    """What to say when decoding a batch ran `device` out of memory: the largest JPEG of the batch (from the JPEG
    headers), and the fixes."""
    jpegs = [s for s in samples if is_jpeg(s)]
    sizes = {s.path: shape[:2] for s in jpegs if (shape := header_shape(bytes(jpeg_data(s).numpy())))}
    largest = max(sizes, key=lambda path: sizes[path][0] * sizes[path][1], default=samples[0].path)
    width, height = sizes.get(largest, (0, 0))
    return (
        f"{device} ran out of memory decoding a batch of {len(samples)} images; the largest, {largest}, is "
        f"{width}x{height} px: stage the photos shrunk (--max-side 500 on trainflow run or stage), or lower "
        "--batch-size"
    )


def decode_one(
    sample: Encoded, read: Callable[[str], torch.Tensor], device: torch.device, tally: dict[str, int]
) -> torch.Tensor:
    """One JPEG decoded on `device`, else on the CPU by `read` (PIL's decode, or a message naming the file)."""
    try:
        return on_device(jpeg_data(sample), device)
    except RuntimeError as exc:
        if ran_out_of_memory(exc):
            raise
        tally["images_decoded_on_cpu"] += 1
        return read(sample.path).to(device)


def on_device(data, device: torch.device):
    """decode_jpeg of `data` (one tensor or a list) on `device`. On CUDA the current stream is drained first
    (pytorch/vision#9606, measured on H100s: torchvision's nvJPEG decode writes from a private stream that is not
    ordered against the caller's, into blocks the caching allocator hands out as soon as the caller's stream has
    queued their last use, and corrupted 134 of 200 iterations; draining the caller's stream before the decode made
    it 0 of 200)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return decode_jpeg(data, device=device, mode=ImageReadMode.RGB)


def jpeg_data(sample: Encoded) -> torch.Tensor:
    """The JPEG bytes of a sample as the 1-D uint8 tensor that decode_jpeg takes (a batch's view as it is; bytes
    copied, torch wanting a writable buffer); TypeError for an image the worker decoded already (decode_images
    passes only JPEGs)."""
    if not is_jpeg(sample):
        raise TypeError(f"{sample.path} was decoded in the worker: it has no JPEG bytes for the device")
    image = sample.image
    return torch.frombuffer(bytearray(image), dtype=torch.uint8) if isinstance(image, bytes) else image


class Prefetch:
    """The items of `source`, made by a thread up to `ahead` items before they are asked for. Its exceptions are
    raised in the consumer's thread; leaving the `with` block (after the last item, on an exception or an interrupt,
    or a consumer that stops early) stops the thread and waits for it."""

    END = object()

    def __init__(self, source: Iterator, ahead: int, join_s: float = 5.0):
        self.join_s = join_s
        self.ready: queue.Queue = queue.Queue(maxsize=max(1, ahead))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.fill, args=(source,), name="trainflow-decode", daemon=True)

    def __enter__(self) -> "Prefetch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        if threading.current_thread() is self.thread:  # its own epoch collected in it: it returns at its next put
            return
        # A stopped thread ends within one put's wait (0.1 s), so that it does not read on while the next epoch starts
        # its loader. The wait is bounded: an epoch left unclosed ends here when the garbage collector takes it, in
        # whatever thread it runs, perhaps one holding a lock the decode thread waits for (logging's, which PIL's
        # debug lines take): waiting forever there deadlocked both (a hung test of the suite, 2026-12-07).
        self.thread.join(self.join_s)

    def __iter__(self) -> Iterator:
        while (item := self.ready.get()) is not self.END:
            if isinstance(item, BaseException):
                raise item
            yield item

    def fill(self, source: Iterator) -> None:
        """The thread: every item of `source`, then END; or the exception that stopped it."""
        try:
            for item in source:
                if not self.put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self.put(exc)
            return
        self.put(self.END)

    def put(self, item) -> bool:
        """Queue `item` once there is room; False when the consumer has stopped first."""
        while not self.stopping.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False
