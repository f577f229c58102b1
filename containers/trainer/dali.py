"""--loader dali: NVIDIA DALI decodes, crops, resizes and flips the images (pip install 'trainflow[dali]').

On a GPU, DALI's "mixed" decoder parses each JPEG on the CPU and decodes it on the GPU with nvJPEG; without one (a
CPU device), its CPU operators decode with libjpeg-turbo: the CPU-only mode the tests run. The training decoder
decodes only the random crop's region of each image. The files come in the order of the trainer's own samplers
(data.ResumableSampler: sharded by rank, shuffled by epoch and seed, skipping what a resumed epoch trained on), handed
to DALI a batch at a time, so a run resumes at the same position as with the other loaders. Batches are uint8 NCHW,
normalised on the device (data.normalise) as the fast loader's are.
"""

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from trainer.errors import UsageError
from trainer.recipe import RATIO, val_resize

INSTALL = "pip install 'trainflow[dali]' (nvidia-dali-cuda130)"


@dataclass(frozen=True)
class TrainSteps:
    """The training augmentation in DALI's operators: random-resized crop (decoding only its region), flip."""

    size: int
    min_crop_scale: float
    hflip: bool

    def images(self, fn, types, files, decoder: str):
        images = fn.decoders.image_random_crop(
            files,
            device=decoder,
            output_type=types.RGB,
            random_area=[self.min_crop_scale, 1.0],
            random_aspect_ratio=list(RATIO),
        )
        images = fn.resize(images, resize_x=self.size, resize_y=self.size)  # antialiased, as torchvision's
        return fn.flip(images, horizontal=fn.random.coin_flip()) if self.hflip else images


@dataclass(frozen=True)
class ValSteps:
    """The evaluation transform in DALI's operators: shorter side to size/0.875, centre crop (deterministic)."""

    size: int

    def images(self, fn, types, files, decoder: str):
        images = fn.decoders.image(files, device=decoder, output_type=types.RGB)
        return fn.crop(fn.resize(images, resize_shorter=val_resize(self.size)), crop=(self.size, self.size))


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
        self.device = device
        seed = (torch.initial_seed() + getattr(sampler, "rank", 0)) % 2**31  # the run's --seed, a stream per shard
        self.pipe = build_pipeline(steps, batch_size, max(1, threads), device, seed)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size if self.drop_last else -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = iter(self.sampler)
        while (batch := list(itertools.islice(order, self.batch_size))) and not (
            self.drop_last and len(batch) < self.batch_size
        ):
            yield self.decode(batch)

    def decode(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch: the files' bytes handed to the pipeline, its output as a torch tensor where DALI left it."""
        self.pipe.feed_input("files", [np.fromfile(self.samples[i][0], dtype=np.uint8) for i in indices])
        images = self.pipe.run()[0].as_tensor()
        targets = torch.tensor([self.samples[i][1] for i in indices])
        if self.device.type == "cpu":
            return torch.from_numpy(np.array(images)), targets
        from nvidia.dali.plugin.pytorch import feed_ndarray

        out = torch.empty(images.shape(), dtype=torch.uint8, device=self.device)
        feed_ndarray(images, out, cuda_stream=torch.cuda.current_stream(self.device))
        return out, targets


def build_pipeline(steps: TrainSteps | ValSteps, batch_size: int, threads: int, device: torch.device, seed: int):
    """A DALI pipeline from files' bytes ("files", fed a batch at a time) to uint8 CHW images: mixed (GPU) decoding
    on a CUDA device, DALI's CPU-only mode (device_id None) otherwise."""
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
        exec_pipelined=False,
        exec_async=False,
    )  # fed one batch, run, read: no queue to keep filled
    def pipeline():
        files = fn.external_source(name="files", dtype=types.DALIDataType.UINT8)
        return fn.transpose(steps.images(fn, types, files, "mixed" if gpu else "cpu"), perm=[2, 0, 1])

    pipe = pipeline()
    pipe.build()
    return pipe
