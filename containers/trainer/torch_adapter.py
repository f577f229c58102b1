"""PyTorch's adapter to the training loop (trainer/core.py): one step (forward, backward, the gradients averaged by
the distributed backend, the optimizer and the schedule), the evaluation, checkpoints, the model file and the
collectives, for a whole model on each worker or, with --parallel pipeline, one stage of it (trainer/pipeline.py).
train.py builds it."""

import contextlib
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint, core, data, metrics
from trainer.distributed import Backend
from trainer.memory import peak_resident_mb
from trainer.pipeline import Pipeline, theoretical_bubble

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the --compile-mode values that replay CUDA graphs
MODEL_FILE = "model.pt"


def logits(output) -> torch.Tensor:
    """The main output of a classifier (GoogLeNet and Inception return a tuple in training mode)."""
    return getattr(output, "logits", output)


@dataclass
class PyTorch:
    """The loop's Adapter for one worker: its model (in pipeline mode: its stage), optimizer, data and backend."""

    args: Namespace
    dist: Backend
    torch_device: torch.device
    model: Any  # the module that trains: wrapped for the backend, compiled (torch.compile returns a callable)
    raw_model: torch.nn.Module  # unwrapped: what checkpoints hold (in pipeline mode: this rank's stage)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_batches: Any  # a DataLoader over a ResumableSampler, or data.SyntheticBatches
    val_batches: Any  # a DataLoader, or None without val data
    amp: bool
    channels_last: bool
    pipeline: Pipeline | None = None  # --parallel pipeline: this rank's stage
    resident_before_model_mb: float = 0.0  # the runtime and data this process held before its model was built

    @property
    def framework(self) -> str:
        return "pytorch"

    @property
    def model_file(self) -> str:
        return MODEL_FILE

    @property
    def backend(self) -> str:
        return self.dist.name

    @property
    def device(self) -> str:
        return str(self.torch_device)

    @property
    def precision(self) -> str:
        return "bf16" if self.amp else "fp32"

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def replicas(self) -> int:
        return self.pipeline.replicas if self.pipeline else self.dist.world_size

    @property
    def reports_loss(self) -> bool:
        return self.dist.rank == (self.pipeline.stages - 1 if self.pipeline else 0)

    # Collectives

    def sum(self, values: list[float]) -> list[float]:
        return self.dist.all_reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist()

    def sum_over_replicas(self, values: list[float]) -> list[float]:
        return self.replica_sum(torch.tensor(values, dtype=torch.float64)).tolist()

    def replica_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the model's replicas: every worker, or in pipeline mode this stage's replicas."""
        return self.pipeline.sum_over_replicas(tensor) if self.pipeline else self.dist.all_reduce_sum(tensor)

    # Steps

    def steps_per_epoch(self) -> int:
        return epoch_steps(self.train_batches, self.args)

    def epoch_batches(self, epoch: int, skip: int):
        sampler = getattr(self.train_batches, "sampler", None)
        if sampler is not None:
            sampler.set_epoch(epoch)
            sampler.skip = skip * self.args.batch_size
        self.model.train()
        return iter(self.train_batches)

    def train_step(self, batch, step: int) -> tuple[torch.Tensor | None, int]:
        """Forward, backward (gradients averaged across workers by the backend, or across pipeline replicas) and
        an optimizer step; the loss as a tensor on the device, so that the host does not wait for the step (None on
        a pipeline stage before the last)."""
        images, targets = self.to_device(*batch)
        if self.args.compile_mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the CUDA graphs may overwrite the last outputs
        self.optimizer.zero_grad()  # Horovod's optimizer takes no set_to_none; None is the default
        if self.pipeline:
            with torch.autocast(self.torch_device.type, dtype=torch.bfloat16, enabled=self.amp):
                loss = self.pipeline.step(images, targets)
        else:
            loss = self.accumulate_gradients(images, targets)
        self.optimizer.step()
        self.scheduler.step()
        return loss, len(targets)

    def accumulate_gradients(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward over --microbatches equal chunks of the batch (gradient accumulation: the same
        gradient as one pass when there is no batch norm); the batch's mean loss, on the device. Workers average
        once, at the end."""
        chunks = self.args.microbatches
        total = torch.zeros((), device=self.torch_device)
        for i, (x, y) in enumerate(zip(images.chunk(chunks), targets.chunk(chunks))):
            with self.dist.no_sync(self.model) if i < chunks - 1 else contextlib.nullcontext():
                with torch.autocast(self.torch_device.type, dtype=torch.bfloat16, enabled=self.amp):
                    loss = torch.nn.functional.cross_entropy(logits(self.model(x)), y) / chunks
                loss.backward()
            total += loss.detach()
        return total

    def add_loss(self, total: torch.Tensor | None, loss: torch.Tensor, images: int) -> torch.Tensor:
        if total is None:
            total = torch.zeros((), dtype=torch.float64, device=self.torch_device)
        total += loss * images
        return total

    def to_device(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Move a batch to the device, in channels-last layout when that is on; the fast loader's uint8 images are
        normalised there (a quarter of the bytes to move, and the device's arithmetic), laid out in the same pass."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        images = data.normalise(images.to(self.torch_device, non_blocking=True), fmt)
        return images, targets.to(self.torch_device, non_blocking=True)

    # The end of an epoch

    @torch.no_grad()
    def average_statistics(self) -> None:
        buffers = [b for b in self.raw_model.buffers() if b.is_floating_point()]
        if self.replicas == 1 or not buffers:
            return
        flat = self.replica_sum(torch.cat([b.reshape(-1) for b in buffers])) / self.replicas
        offset = 0
        for b in buffers:
            b.copy_(flat[offset : offset + b.numel()].view_as(b))
            offset += b.numel()

    @torch.no_grad()
    def evaluate(self) -> list[float] | None:
        if self.val_batches is None:
            return None
        self.raw_model.eval()  # unwrapped: DDP would sync buffers on each forward, and shards may differ in length
        sums = torch.zeros(4, dtype=torch.float64)  # loss, top-1 hits, top-5 hits, images
        for batch in self.val_batches:
            images, targets = self.to_device(*batch)
            with torch.autocast(self.torch_device.type, dtype=torch.bfloat16, enabled=self.amp):
                out = self.pipeline.forward_only(images) if self.pipeline else logits(self.raw_model(images))
            if out is None:
                continue  # a pipeline stage before the last: the last one scores the batch
            loss = torch.nn.functional.cross_entropy(out.float(), targets, reduction="sum")
            top1, top5 = metrics.topk_correct(out, targets)
            sums += torch.tensor([loss.item(), top1, top5, len(targets)], dtype=torch.float64)
        return sums.tolist()

    # Checkpoints

    def save_checkpoint(self, progress: dict, step: int) -> None:
        """Rank 0 writes the model, the optimizer, the schedule and the progress. In pipeline mode each stage of
        replica 0 writes its own part first, under the single-device model's names (see checkpoint.py): no rank
        ever holds the whole model."""
        folder = core.checkpoints_folder(self.args)
        parts = {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.pipeline:
            parts = self.pipeline.stage_state(self.optimizer)
            if 0 < self.rank < self.pipeline.stages:
                path = checkpoint.checkpoint_path(folder, step)
                checkpoint.save_torch(checkpoint.stage_path(path, self.pipeline.stage), parts)
            self.dist.all_reduce_sum(torch.zeros(1))  # every stage's part is on disk before rank 0 commits the step
        if self.rank != 0:
            return
        state = {
            **parts,
            "stages": self.pipeline.stages if self.pipeline else 1,
            "scheduler": self.scheduler.state_dict(),
            **progress,
        }
        checkpoint.save_checkpoint(folder, state, step, self.args.keep_checkpoints)

    def restore_schedule(self, state: dict) -> None:
        """The scheduler's place, and the rate of the next step in the optimizer (LambdaLR's constructor set step
        0's). The base rate is this run's --lr, as the logged rate and the TensorFlow loop's: the checkpoint's
        (its scheduler's base_lrs, its optimizer's initial_lr) would train a run resumed with another --lr at the
        old one."""
        self.scheduler.load_state_dict(state["scheduler"])
        self.scheduler.base_lrs = [self.args.lr] * len(self.optimizer.param_groups)
        factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)  # this run's schedule (not saved)
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["lr"] = self.args.lr, self.args.lr * factor

    # Results

    def digest(self) -> str:
        return metrics.parameter_digest(self.raw_model.named_parameters())

    def memory(self) -> tuple[int, int, float, float]:
        params, held = metrics.held(self.pipeline.whole if self.pipeline else self.raw_model)  # pipeline: mostly meta
        return params, held, peak_memory_mb(self.torch_device), self.training_memory_mb()

    def training_memory_mb(self) -> float:
        """The peak memory that building and training the model added: on CUDA the allocated peak (which never held
        the CUDA context or the libraries), on the CPU the peak resident set above what the process held before its
        model (PyTorch, torchvision and the data set's index: the CPU's counterpart of the context)."""
        if self.torch_device.type == "cuda":
            return peak_memory_mb(self.torch_device)
        return peak_resident_mb() - self.resident_before_model_mb

    def save_model(self, out: Path, classes: list[str]) -> str:
        whole = self.pipeline.whole_state() if self.pipeline else self.raw_model.state_dict()
        if self.rank != 0 or whole is None:  # whole_state: the whole model on rank 0 only
            return ""
        if self.pipeline:  # the whole model's digest, as the single-device model's
            digest = metrics.parameter_digest((n, whole[n]) for n, _ in self.pipeline.whole.named_parameters())
        else:
            digest = self.digest()
        model = {"arch": self.args.model, "classes": classes, "image_size": self.args.image_size, "state_dict": whole}
        checkpoint.save_torch(out / MODEL_FILE, model)
        return digest

    def versions(self) -> dict[str, str]:
        return metrics.library_versions()

    def results(self) -> dict:
        """Pipeline mode: the split, the schedule and each rank's measured idle share beside GPipe's theory."""
        if not self.pipeline:
            return {"parallel": "data"}
        p, args = self.pipeline, self.args
        idle, steps = core.rank_values(self, p.idle_fraction()), p.steady_steps()
        return {
            "parallel": "pipeline",
            "pipeline": {
                "stages": p.stages,
                "replicas": p.replicas,
                "microbatches": p.microbatches,
                "schedule": args.pipeline_schedule,
                "balance": args.balance,
                "split": p.split.names,
                "stage_params": p.split.params,
                "step_seconds_mean": sum(steps) / len(steps),
                "idle_fraction_per_rank": idle,
                "idle_fraction_measured": sum(idle) / len(idle),
                "idle_fraction_theoretical": theoretical_bubble(p.stages, p.microbatches),
            },
        }

    def close(self) -> None:
        self.dist.shutdown()


def epoch_steps(train_batches: Any, args: Namespace) -> int:
    """Optimizer steps in one full epoch (the --steps-per-epoch cap applied)."""
    if isinstance(train_batches, data.SyntheticBatches):
        return len(train_batches)
    sampler, cap = train_batches.sampler, args.steps_per_epoch
    full = (len(sampler) + sampler.skip) // args.batch_size
    return min(full, cap) if cap else full


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory: GPU memory allocated on CUDA, its own peak resident set on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_resident_mb()
