"""--loader dali: NVIDIA DALI decodes, crops, resizes and flips the images (pip install 'trainflow[dali]').

On a GPU, DALI's "mixed" decoder parses each JPEG on the CPU and decodes it whole on the GPU, on its hardware JPEG
engines where it has them (`hw_decoder_load`, as NVIDIA's MLPerf configuration does), then crops, resizes and flips
on the GPU; without one (a CPU device), its CPU operators decode with libjpeg-turbo: the CPU-only mode the tests run.
Whole images, not the crop's region: the region decode of nvImageCodec 0.9, the version DALI 2.4 requires, crashes on
H100s (NVIDIA/nvImageCodec#55). The files come in the order of the trainer's own samplers (data.ResumableSampler:
sharded by rank, shuffled by epoch and seed, skipping what a resumed epoch trained on), a batch at a time from the
pipeline's source, so a run resumes at the same position as with the other loaders. The pipeline runs pipelined and
asynchronously, `PREFETCH` batches ahead of the training step; an epoch left early is drained, so the next starts
clean. Batches are uint8 NCHW, normalised on the device (data.normalise) as the fast loader's are.
"""

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from nodelib.errors import UsageError
from trainer.recipe import RATIO, val_resize

INSTALL = "pip install 'trainflow[dali]' (nvidia-dali-cuda130)"
PREFETCH = 2  # batches the pipeline runs ahead of the training step
HW_DECODER_LOAD = 0.99  # the share of each batch for the GPU's hardware JPEG engines (NVIDIA's MLPerf setting)


@dataclass(frozen=True)
class TrainSteps:
    """The training augmentation in DALI's operators: random-resized crop (decoding only its region), flip."""

    size: int
    min_crop_scale: float
    hflip: bool

    def images(self, fn, types, files, decoder: str):
        images = decode_whole(fn, types, files, decoder)
        images = fn.random_resized_crop(  # antialiased, as torchvision's
            images, size=[self.size, self.size], random_area=[self.min_crop_scale, 1.0], random_aspect_ratio=list(RATIO)
        )
        return fn.flip(images, horizontal=fn.random.coin_flip()) if self.hflip else images


@dataclass(frozen=True)
class ValSteps:
    """The evaluation transform in DALI's operators: shorter side to size/0.875, centre crop (deterministic)."""

    size: int

    def images(self, fn, types, files, decoder: str):
        images = decode_whole(fn, types, files, decoder)
        return fn.crop(fn.resize(images, resize_shorter=val_resize(self.size)), crop=(self.size, self.size))


def decode_whole(fn, types, files, decoder: str):
    """The files decoded whole to RGB: on the GPU's hardware JPEG engines first where the decoder is mixed."""
    engines = {"hw_decoder_load": HW_DECODER_LOAD} if decoder == "mixed" else {}
    return fn.decoders.image(files, device=decoder, output_type=types.RGB, **engines)


class DaliBatches:
    """(uint8 NCHW images on `device`, targets) of `samples`, in the order of `sampler`, decoded by DALI."""

    def __init__(
        self,
        samples: list,
        sampler,
        batch_size: int,
        steps: TrainSteps | ValSteps,
        device: torch.device,
        threads: int,
        drop_last: bool,
    ):
        self.samples, self.sampler, self.batch_size, self.drop_last = samples, sampler, batch_size, drop_last
        self.device, self.source = device, EpochSource(samples)
        seed = (torch.initial_seed() + getattr(sampler, "rank", 0)) % 2**31  # the run's --seed, a stream per shard
        self.pipe = build_pipeline(steps, batch_size, max(1, threads), device, seed, self.source)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size if self.drop_last else -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = iter(self.sampler)  # read now: the trainer has set the sampler's epoch and what it skips
        batches = iter(lambda: list(itertools.islice(order, self.batch_size)), [])
        self.source.start(b for b in batches if not (self.drop_last and len(b) < self.batch_size))
        finished = False
        try:
            while True:
                try:
                    images, targets = self.pipe.run()
                except StopIteration:
                    finished = True
                    return
                yield self.to_torch(images), targets_of(targets)
        finally:
            if not finished:  # left early: the batches already prefetched are run and dropped
                self.source.stop()
                drain(self.pipe)
            self.pipe.reset()

    def decode(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of these samples through the pipeline on its own, as an epoch of one batch (the unit that
        `trainflow bench loader` times)."""
        self.source.start(iter([indices]))
        try:
            images, targets = self.pipe.run()
            return self.to_torch(images), targets_of(targets)
        finally:
            drain(self.pipe)
            self.pipe.reset()

    def to_torch(self, images) -> torch.Tensor:
        """The pipeline's images as a torch tensor where DALI left them."""
        images = images.as_tensor()
        if self.device.type == "cpu":
            return torch.from_numpy(np.array(images))
        from nvidia.dali.plugin.pytorch import feed_ndarray

        out = torch.empty(images.shape(), dtype=torch.uint8, device=self.device)
        feed_ndarray(images, out, cuda_stream=torch.cuda.current_stream(self.device))
        return out


class EpochSource:
    """The pipeline's source: the files' bytes and targets of an epoch's batches, one batch a call (DALI calls it
    ahead of the training step, as it prefetches); StopIteration at the epoch's end, or once stopped."""

    def __init__(self, samples: list):
        self.samples = samples
        self.batches: Iterator[list[int]] = iter(())

    def start(self, batches: Iterator[list[int]]) -> None:
        self.batches = batches

    def stop(self) -> None:
        self.batches = iter(())

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        batch = next(self.batches)
        files = [np.fromfile(self.samples[i][0], dtype=np.uint8) for i in batch]
        return files, [np.array([self.samples[i][1]], dtype=np.int64) for i in batch]


def targets_of(targets) -> torch.Tensor:
    """The pipeline's targets output (one int64 a sample) as a 1-D torch tensor."""
    return torch.from_numpy(np.array(targets.as_tensor())).reshape(-1)


def drain(pipe) -> None:
    """Run the pipeline until its source says the epoch is over."""
    try:
        while True:
            pipe.run()
    except StopIteration:
        pass


def build_pipeline(
    steps: TrainSteps | ValSteps, batch_size: int, threads: int, device: torch.device, seed: int, source: EpochSource
):
    """A DALI pipeline from files' bytes and targets (`source`, a batch a call) to uint8 CHW images and the
    targets: mixed (GPU) decoding on a CUDA device, DALI's CPU-only mode (device_id None) otherwise; pipelined and
    asynchronous, PREFETCH batches ahead."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as exc:
        raise UsageError(f"--loader dali needs NVIDIA DALI ({exc}); {INSTALL}, or pass --loader fast") from None
    gpu = device.type == "cuda"

    @pipeline_def(
        batch_size=batch_size,
        num_threads=threads,
        device_id=(device.index or 0) if gpu else None,  # type: ignore[arg-type]  # stub says int; None: CPU-only
        seed=seed,
        exec_pipelined=True,
        exec_async=True,
        prefetch_queue_depth=PREFETCH,
    )
    def pipeline():
        files, targets = fn.external_source(
            source=source, num_outputs=2, batch=True, dtype=[types.DALIDataType.UINT8, types.DALIDataType.INT64]
        )
        return fn.transpose(steps.images(fn, types, files, "mixed" if gpu else "cpu"), perm=[2, 0, 1]), targets

    pipe = pipeline()
    pipe.build()
    return pipe
