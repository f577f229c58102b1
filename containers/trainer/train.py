"""Training of a torchvision image classifier, data-parallel or pipeline-parallel: one loop, any launcher.

One process (CPU or one GPU):
    python containers/trainer/train.py --data DATA --out OUT --model resnet18 --epochs 10

N processes on one machine, torch.distributed (DDP; gloo on CPU, NCCL on GPU):
    torchrun --standalone --nproc_per_node 2 containers/trainer/train.py --data DATA --out OUT

N processes on one machine, Horovod:
    horovodrun -np 2 -H localhost:2 python containers/trainer/train.py --data DATA --out OUT

2 nodes with 4 GPUs each (run on both; OUT and DATA on storage both nodes mount):
    torchrun --nnodes 2 --nproc_per_node 4 --node_rank {0,1} --rdzv-backend c10d \\
        --rdzv-endpoint NODE0:29500 containers/trainer/train.py --data DATA --out OUT
    horovodrun -np 8 -H node0:4,node1:4 python containers/trainer/train.py --data DATA --out OUT

DATA is an ImageNet-layout folder (train/<class>/..., val/<class>/...) or the word "synthetic".
Rank 0 alone writes OUT: checkpoints/ (every --checkpoint-every steps and at each epoch end; in pipeline
mode each stage of the first replica writes its own part of them), metrics.json (per epoch: loss, val
top-1/top-5, images/s) and model.pt. A run started again with the
same OUT resumes from its newest checkpoint, mid-epoch included. Bad input exits with status 2 and a
one-line message. Images that cannot be decoded are refused all at once, listed in OUT/bad-files.tsv, or
with --bad-files skip left out of training (metrics.json says which); see data.py. Run with --help for
every option.
"""

import contextlib
import functools
import itertools
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the `trainer` package importable, its scripts version checked
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[1]))
    from trainer.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported

import torch

from trainer import badfiles, checkpoint, console, data, gpu_decode, metrics, tracking
from trainer.distributed import Backend, leave_process_group, make_backend, pick_device
from trainer.errors import UsageError
from trainer.layout import SYNTHETIC
from trainer.memory import peak_resident_mb, resident_mb
from trainer.models import build_model, build_on_meta, check_model_name
from trainer.options import build_parser, check_args, check_layout, check_output_folder, decay_epochs
from trainer.pipeline import Pipeline, blocks_of, parameter_costs, partition, theoretical_bubble
from trainer.schedule import Schedule, lr_factor

log = logging.getLogger("trainer")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the --compile-mode values that replay CUDA graphs


@dataclass
class Run:
    """Everything one worker's training loop touches."""

    args: object
    backend: Backend
    device: torch.device
    model: torch.nn.Module
    raw_model: torch.nn.Module  # unwrapped: what checkpoints hold (in pipeline mode: this rank's stage)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_batches: object
    val_batches: object | None
    classes: list[str]
    amp: bool
    channels_last: bool
    step: int = 0
    epoch: int = 0
    skip_steps: int = 0  # steps of the current epoch done before a resume
    history: list[dict] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    wall_before: float = 0.0  # seconds spent by the attempts before a resume
    started: float = field(default_factory=time.perf_counter)
    pipeline: Pipeline | None = None  # --parallel pipeline: this rank's stage
    data_facts: dict = field(default_factory=dict)  # images trained and validated on, the bad ones left out
    resident_before_model_mb: float = 0.0  # the runtime and data this process held before its model was built
    tracker: tracking.Tracker = field(default_factory=tracking.Tracker)  # off unless --tracking-uri

    @property
    def replicas(self) -> int:
        """Model replicas, each on its own shard of the data (the workers, or the pipelines)."""
        return self.pipeline.replicas if self.pipeline else self.backend.world_size

    @property
    def reports_loss(self) -> bool:
        """Whether this rank logs the loss: rank 0, or in pipeline mode the last stage of replica 0."""
        return self.backend.rank == (self.pipeline.stages - 1 if self.pipeline else 0)

    def wall_seconds(self) -> float:
        """Wall time of the whole run, over every resumed attempt."""
        return self.wall_before + time.perf_counter() - self.started

    @property
    def master(self) -> bool:
        return self.backend.rank == 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, train, and turn bad input into a one-line error with exit status 2."""
    return console.run_main(build_parser().parse_args(argv), check_args, check_only, train, leave_process_group)


def check_only(args) -> int:
    """Validate the arguments, output folder, data (decoding every image with --verify-images) and model."""
    check_model_name(args.model)
    check_output_folder(args.out)
    classes, replicas = synthetic_classes(args.num_classes), args.check_workers
    if args.parallel == "pipeline":
        check_layout(args.check_workers, args.stages, args.batch_size, args.microbatches)
        replicas = args.check_workers // args.stages
    if args.data != SYNTHETIC:
        splits = data.index_folder(Path(args.data))
        train_split, val_split, record, source = badfiles.usable_splits(args, Path(args.out), splits)
        if source == data.DECODED:
            data.hand_to_workers(Path(args.out), record)  # the workers skip what this decode found, not decode again
        data.check_batch_fits(args.batch_size, replicas, len(train_split.samples))
        classes = train_split.classes
        log.info("data ok: %d training images in %d classes", len(train_split.samples), len(classes))
    if found := checkpoint.latest_checkpoint(args_checkpoints(args)):  # another run's: refused before any worker
        check_resumable(checkpoint.load_checkpoint(found), args.model, classes, args.out)
    num_classes = len(classes)
    try_one_step(args, num_classes)
    if args.parallel == "pipeline":
        check_splittable(args, num_classes)
    return 0


def check_splittable(args, num_classes: int) -> None:
    """The model splits into at least --stages blocks."""
    partition(parameter_costs(blocks_of(build_model(args.model, num_classes))), args.stages, args.model)


def try_one_step(args, num_classes: int) -> None:
    """One forward and backward pass on a tiny batch of the configured size, on the CPU."""
    model = build_model(args.model, num_classes).train()
    images = torch.zeros(min(args.batch_size, 2), 3, args.image_size, args.image_size)
    try:
        logits(model(images)).sum().backward()
    except (RuntimeError, ValueError, AssertionError) as exc:
        raise UsageError(
            f"{args.model} cannot train on batches of {args.batch_size} images of {args.image_size} px "
            f"({str(exc).splitlines()[0]}); change --batch-size, --image-size or --model"
        ) from None


def logits(output) -> torch.Tensor:
    """The main output of a classifier (GoogLeNet and Inception return a tuple in training mode)."""
    return getattr(output, "logits", output)


def train(args) -> None:
    """Set up this worker, resume if OUT holds a checkpoint, train every epoch, write the results."""
    run = set_up(args)
    run.tracker = tracking.open_tracker(args, run.reports_loss)
    while run.epoch < args.epochs:
        row = train_epoch(run)
        average_buffers(run)
        row.update(evaluate(run))
        run.history.append(row)
        run.epoch += 1
        log_epoch(run, row)
        save_checkpoint(run, step_in_epoch=0)
        if run.master:
            write_metrics(run, status="running")
    finish(run)


def set_up(args) -> Run:
    """Build the backend, device, data, model, optimizer and schedule; load the newest checkpoint."""
    backend = make_backend(args.backend)
    wants_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    backend.setup(torch.device("cuda" if wants_cuda else "cpu"))
    console.setup_logging(backend.rank)
    device = pick_device(args.device, backend.local_rank)
    log.info(
        "worker %d of %d (%s) on host %s, %s",
        backend.rank,
        backend.world_size,
        backend.name,
        socket.gethostname(),
        device,
    )
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) // backend.local_world_size))
    torch.manual_seed(args.seed)
    if backend.rank == 0:
        check_output_folder(args.out)
    replica, replicas = data_shard(args, backend)
    channels_last = resolve(args.channels_last, device)
    train_batches, val_batches, classes, facts = make_batches(args, backend, device, channels_last, replica, replicas)
    before_model = resident_mb()
    model, pipeline = build_for_rank(args, backend, len(classes), device, channels_last)
    optimizer = make_optimizer(args, model, device)
    run = Run(
        args,
        backend,
        device,
        model,
        model,
        optimizer,
        None,
        train_batches,
        val_batches,
        classes,
        amp=resolve_precision(args.precision, device) == "bf16",
        channels_last=channels_last,
        pipeline=pipeline,
        data_facts=facts,
        resident_before_model_mb=before_model,
    )
    state = load_latest_checkpoint(run)
    wrap_for_backend(run, state)
    run.scheduler = make_scheduler(run)
    if state is not None:
        restore_progress(run, state)
    return run


def make_optimizer(args, model: torch.nn.Module, device: torch.device) -> torch.optim.SGD:
    """SGD with momentum and weight decay; --fused-optimizer: one kernel updates every parameter (auto: where torch
    has it, CUDA and the CPU) rather than kernels per parameter (off: torch's default, foreach on CUDA)."""
    fused = args.fused_optimizer == "on" or (args.fused_optimizer == "auto" and device.type in ("cpu", "cuda"))
    return torch.optim.SGD(
        model.parameters(),
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        fused=fused or None,
    )


def data_shard(args, backend: Backend) -> tuple[int, int]:
    """(this worker's shard, shards) of the training data: one per worker, or one per pipeline replica (its
    stages see the same batches)."""
    if args.parallel != "pipeline":
        return backend.rank, backend.world_size
    if backend.name != "ddp":
        raise UsageError(
            "--parallel pipeline runs on torch.distributed: start it with torchrun (Horovod has no "
            "pipeline parallelism)"
        )
    check_layout(backend.world_size, args.stages, args.batch_size, args.microbatches)
    return backend.rank // args.stages, backend.world_size // args.stages


def build_for_rank(args, backend: Backend, num_classes: int, device: torch.device, channels_last: bool):
    """(the module this rank trains, its Pipeline or None): the whole model on the device, or with --parallel
    pipeline only this rank's stage (the rest of the model is never materialised)."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if args.parallel == "pipeline":
        pipeline = split_for_pipeline(args, backend, num_classes, device, memory_format)
        return pipeline.module, pipeline
    return build_model(args.model, num_classes).to(device).to(memory_format=memory_format), None


def split_for_pipeline(
    args, backend: Backend, num_classes: int, device: torch.device, memory_format: torch.memory_format
) -> Pipeline:
    """This rank's stage of the model built on the meta device and split, with the split printed once."""
    model, recipe = build_on_meta(args.model, num_classes)
    pipeline = Pipeline(model, recipe, args, backend.rank, backend.world_size, device, memory_format)
    if backend.rank == 0:
        log.info(
            "pipeline: %d stages x %d replicas, %d micro-batches (%s), balanced by %s: %s",
            pipeline.stages,
            pipeline.replicas,
            pipeline.microbatches,
            args.pipeline_schedule,
            args.balance,
            pipeline.split.describe(args.balance),
        )
    return pipeline


def make_batches(args, backend: Backend, device: torch.device, channels_last: bool, shard: int, shards: int):
    """This worker's training batches (shard `shard` of `shards`, or a fixed synthetic batch), val batches, classes,
    and the facts metrics.json records about the data (images used, images left out)."""
    if args.data == SYNTHETIC:
        steps = args.steps_per_epoch or 100
        batches = data.SyntheticBatches(
            args.batch_size, args.image_size, args.num_classes, steps, args.seed + shard, device, channels_last
        )
        return batches, None, synthetic_classes(args.num_classes), {}
    splits, rank, world = data.index_folder(Path(args.data)), backend.rank, backend.world_size
    gather = functools.partial(all_gather_json, backend)
    train_split, val_split, record, _ = badfiles.usable_splits(args, Path(args.out), splits, rank, world, gather)
    facts = badfiles.data_facts(args, Path(args.out), train_split, val_split, record)
    data.check_batch_fits(args.batch_size, shards, len(train_split.samples))
    pin = resolve(args.pin_memory, device)
    train_set = data.image_files(
        train_split, data.train_transform(args.image_size, args.min_crop_scale, args.hflip, args.loader), args.loader
    )
    facts["jpeg_decoding"] = check_loader(args, backend.rank, device, train_split)
    sampler = data.ResumableSampler(train_set, shards, shard, shuffle=True, seed=args.seed)
    train_batches = data.make_loader(train_set, args.batch_size, sampler, args.loader_workers, pin, True, device)
    if val_split is None:
        log.warning("no val/ folder in %s: training without validation", args.data)
        return train_batches, None, train_split.classes, facts
    val_set = data.image_files(val_split, data.val_transform(args.image_size, args.loader), args.loader)
    val_sampler = data.ShardSampler(len(val_set), shard, shards)  # a pipeline's stages pass the same batches on
    val_batches = data.make_loader(val_set, args.batch_size, val_sampler, args.loader_workers, pin, False, device)
    return train_batches, val_batches, train_split.classes, facts


def check_loader(args, rank: int, device: torch.device, train_split: data.Split) -> str:
    """Say what the chosen loader lacks here (the fast loader's partial decoding, its restart markers); refuse
    --loader gpu where the device has no JPEG decoder. Returns how the training JPEGs are decoded, as metrics.json
    records it (jpeg_decoding): crop (only each crop, jpeg_crop), whole: why (the fast loader without it), nvjpeg,
    libjpeg-turbo (--loader gpu off CUDA), or the loader's name (pil, dali)."""
    if args.loader == "gpu":
        gpu_decode.check_device(device)
        if device.type == "cuda":
            return "nvjpeg"
        log.warning("--loader gpu on %s: the decode thread decodes with libjpeg-turbo, not nvJPEG", device)
        return "libjpeg-turbo"
    if args.loader != "fast":
        return args.loader
    if not data.jpeg_crop.library():
        log.warning(
            "partial JPEG decoding is unavailable (%s): the fast loader decodes whole images",
            data.jpeg_crop.unavailable(),
        )
        return f"whole: {data.jpeg_crop.unavailable()}"
    if rank == 0 and (lacking := data.without_restart_markers(train_split))[0]:
        log.info(
            "%d of %d training JPEGs sampled have no restart markers: `trainflow data add-restart-markers "
            "--data DIR` rewrites them losslessly, once, so that the fast loader decodes only each crop's MCUs "
            "(about 1.2x its images/s per core, README: Benchmark)",
            *lacking,
        )
    return "crop"


def all_gather_json(backend: Backend, value) -> list:
    """`value` (anything JSON holds) of every rank, in rank order: its bytes, each rank's at its own offset of
    one buffer, summed over the ranks (all_reduce_sum is the one collective every backend has)."""
    if backend.world_size == 1:
        return [value]
    mine = json.dumps(value).encode()
    sizes = [int(n) for n in rank_values(backend, len(mine))]
    start = sum(sizes[: backend.rank])
    buffer = torch.zeros(sum(sizes), dtype=torch.int32)  # Horovod reduces no uint8 tensors
    buffer[start : start + len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    total = backend.all_reduce_sum(buffer).to(torch.uint8).numpy().tobytes()
    return [json.loads(total[at : at + n]) for at, n in zip(itertools.accumulate([0] + sizes), sizes)]


def load_latest_checkpoint(run: Run) -> dict | None:
    """The newest checkpoint in OUT with the model weights already loaded, or None."""
    found = checkpoint.latest_checkpoint(args_checkpoints(run.args))
    if found is None:
        return None
    state = checkpoint.load_checkpoint(found)  # any layout's, as the single-device model's
    check_resumable(state, run.args.model, run.classes, run.args.out)
    if run.pipeline:
        run.pipeline.load_stage(state["model"], state["optimizer"], run.optimizer)  # this stage's tensors only
    else:
        run.raw_model.load_state_dict(state["model"])
    log.info("resumed from %s: epoch %d, step %d", found.name, state["epoch"] + 1, state["step"])
    return state


def wrap_for_backend(run: Run, state: dict | None) -> None:
    """Wrap model and optimizer for the backend, restore the optimizer, and sync rank 0's state (in pipeline
    mode the stages average their gradients themselves, and every rank starts from the same seed)."""
    if run.pipeline is None:
        run.model, run.optimizer = run.backend.wrap(
            run.raw_model, run.optimizer, run.args.microbatches, run.args.grad_compression
        )
    if state is not None and run.pipeline is None:  # after wrapping: Horovod's optimizer starts with empty state
        run.optimizer.load_state_dict(state["optimizer"])
    run.backend.broadcast_state(run.raw_model, run.optimizer)
    if run.pipeline is None:
        # the wrapped model: under DDP, TorchDynamo splits the graph at the gradient buckets so that the all-reduce
        # still overlaps the backward pass; checkpoints keep using raw_model's names
        run.model = compile_model(run.model, run.args.compile, run.device, run.args.compile_mode)


def compile_model(model: torch.nn.Module, choice: str, device: torch.device, mode: str = "default") -> torch.nn.Module:
    """The model through torch.compile in `mode` (--compile-mode) as --compile says: `on` compiles and fails where
    compiling fails; `auto` (on for a GPU) runs eagerly, with TorchDynamo's warning, whatever it cannot compile (a
    node without a C++ compiler, say): a default never ends a run."""
    if not resolve(choice, device):
        if mode != "default":
            log.warning(
                "--compile-mode %s is ignored: --compile %s leaves the model uncompiled on %s", mode, choice, device
            )
        return model
    torch._dynamo.config.suppress_errors = choice == "auto"
    log.info(
        "compiling the model (--compile %s, mode %s)%s",
        choice,
        mode,
        ": eager where compiling fails" if choice == "auto" else "",
    )
    return torch.compile(model, mode=mode)


def make_scheduler(run: Run) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup plus decay, per optimizer step, as a factor on the one-worker rate."""
    args = run.args
    sched = Schedule(
        steps_per_epoch(run),
        args.epochs,
        run.replicas,
        args.warmup_epochs,
        args.schedule,
        decay_epochs(args.lr_decay_epochs),
    )
    return torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: lr_factor(s, sched))


def restore_progress(run: Run, state: dict) -> None:
    """Continue the step count, schedule, history and wall time; skip what the epoch already trained on."""
    run.scheduler.load_state_dict(state["scheduler"])
    for group, lr in zip(run.optimizer.param_groups, run.scheduler.get_last_lr()):
        group["lr"] = lr  # LambdaLR's constructor set the step-0 rate
    run.step, run.epoch, run.history = state["step"], state["epoch"], state["history"]
    run.wall_before = state["wall_seconds"]
    run.resumed_from = state["resumed_from"] + [run.step]
    run.skip_steps = state["samples_in_epoch"] // (run.args.batch_size * run.replicas)


def check_resumable(state: dict, model: str, classes: list[str], out: str) -> None:
    """A checkpoint from another model or class list cannot be resumed (the preflight and every worker check it)."""
    if state["arch"] != model or state["classes"] != classes:
        raise UsageError(
            f"{out} holds checkpoints of another run ({state['arch']}, {len(state['classes'])} classes; this run: "
            f"{model}, {len(classes)} classes); pass a new --out or delete its checkpoints/"
        )


def synthetic_classes(num_classes: int) -> list[str]:
    """The class names of synthetic data: its class indices."""
    return [str(i) for i in range(num_classes)]


def steps_per_epoch(run: Run) -> int:
    """Optimizer steps in one full epoch (the --steps-per-epoch cap applied)."""
    if isinstance(run.train_batches, data.SyntheticBatches):
        return len(run.train_batches)
    sampler = run.train_batches.sampler
    full = (len(sampler) + sampler.skip) // run.args.batch_size
    return min(full, run.args.steps_per_epoch) if run.args.steps_per_epoch else full


def train_epoch(run: Run) -> dict:
    """One epoch of synchronous SGD; returns its loss (over all workers) and throughput."""
    args, sampler = run.args, getattr(run.train_batches, "sampler", None)
    if sampler is not None:
        sampler.set_epoch(run.epoch)
        sampler.skip = run.skip_steps * args.batch_size
    run.model.train()
    done, run.skip_steps = run.skip_steps, 0
    # the loss stays on the device until the epoch ends (or a progress line): no host-device sync in the step
    loss_sum, counted = torch.zeros((), dtype=torch.float64, device=run.device), metrics.Throughput()
    batches = iter(run.train_batches)
    while done < steps_per_epoch(run) and (batch := counted.next_batch(batches)) is not None:
        images, targets = batch
        loss = train_step(run, images, targets)
        done, run.step = done + 1, run.step + 1
        if args.checkpoint_every and run.step % args.checkpoint_every == 0:
            save_checkpoint(run, step_in_epoch=done)  # every rank: pipeline stages gather the whole model
        if loss is None:  # a pipeline stage before the last: the last one counts the images and the loss
            continue
        loss_sum += loss * len(targets)
        counted.count(len(targets))
        if run.reports_loss and run.step % args.log_every == 0:
            log_step(run, done, loss.item(), counted)
    seconds, rate, steady = counted.rates()
    totals = run.backend.all_reduce_sum(
        torch.tensor([float(loss_sum), counted.seen, rate, steady, *counted.cpu_ms_per_step()], dtype=torch.float64)
    )
    waits = rank_values(run.backend, counted.data_wait_share())
    workers = run.backend.world_size
    return {
        "epoch": run.epoch + 1,
        "step": run.step,
        "train_loss": totals[0].item() / max(totals[1].item(), 1),
        "images_per_sec": totals[2].item(),
        "images_per_sec_per_worker": totals[2].item() / workers,
        "steady_images_per_sec": totals[3].item(),
        "epoch_seconds": seconds,
        "lr": run.scheduler.get_last_lr()[0],
        "data_wait_share": [round(w, 4) for w in waits],
        "training_thread_cpu_ms_per_step": totals[4].item() / workers,
        "other_threads_cpu_ms_per_step": totals[5].item() / workers,
    }


def log_step(run: Run, done: int, loss: float, counted: metrics.Throughput) -> None:
    """The progress line (the orchestrator's PROGRESS_LINE reads it) and the step's metrics to the tracker. images/s
    is this rank's rate so far this epoch times the replicas: all of them, as the epoch's row counts."""
    lr, images_per_sec = run.scheduler.get_last_lr()[0], counted.rates()[1] * run.replicas
    console.progress(run.tracker, run.epoch + 1, run.step, done, steps_per_epoch(run), loss, lr, images_per_sec)


def train_step(run: Run, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """Forward, backward (gradients averaged across workers by the backend, or across pipeline replicas) and
    an optimizer step; the loss as a tensor on the device, so that the host does not wait for the step (None on a
    pipeline stage before the last)."""
    images, targets = to_device(run, images, targets)
    if run.args.compile_mode in CUDA_GRAPH_MODES:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the CUDA graphs may overwrite the last one's outputs
    run.optimizer.zero_grad()  # Horovod's optimizer takes no set_to_none; None is the default
    if run.pipeline:
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.amp):
            loss = run.pipeline.step(images, targets)
    else:
        loss = accumulate_gradients(run, images, targets)
    run.optimizer.step()
    run.scheduler.step()
    return loss


def accumulate_gradients(run: Run, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Forward and backward over --microbatches equal chunks of the batch (gradient accumulation: the same
    gradient as one pass when there is no batch norm); the batch's mean loss, on the device. Workers average once,
    at the end."""
    chunks = run.args.microbatches
    total = torch.zeros((), device=run.device)
    for i, (x, y) in enumerate(zip(images.chunk(chunks), targets.chunk(chunks))):
        with run.backend.no_sync(run.model) if i < chunks - 1 else contextlib.nullcontext():
            with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.amp):
                loss = torch.nn.functional.cross_entropy(logits(run.model(x)), y) / chunks
            loss.backward()
        total += loss.detach()
    return total


@torch.no_grad()
def average_buffers(run: Run) -> None:
    """Average batch-norm statistics over the replicas (each saw its own batches): one model to evaluate and save."""
    buffers = [b for b in run.raw_model.buffers() if b.is_floating_point()]
    if run.replicas == 1 or not buffers:
        return
    flat = sum_over_replicas(run, torch.cat([b.reshape(-1) for b in buffers])) / run.replicas
    offset = 0
    for b in buffers:
        b.copy_(flat[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


@torch.no_grad()
def evaluate(run: Run) -> dict:
    """Validation loss and top-1/top-5 accuracy over the whole val split, summed across workers."""
    if run.val_batches is None:
        return {"val_loss": None, "val_top1": None, "val_top5": None}
    run.raw_model.eval()  # unwrapped: DDP would sync buffers on each forward, and shards may differ in length
    sums = torch.zeros(4, dtype=torch.float64)  # loss, top-1 hits, top-5 hits, images
    for images, targets in run.val_batches:
        images, targets = to_device(run, images, targets)
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.amp):
            out = run.pipeline.forward_only(images) if run.pipeline else logits(run.raw_model(images))
        if out is None:
            continue  # a pipeline stage before the last: the last one scores the batch
        loss = torch.nn.functional.cross_entropy(out.float(), targets, reduction="sum")
        top1, top5 = metrics.topk_correct(out, targets)
        sums += torch.tensor([loss.item(), top1, top5, len(targets)], dtype=torch.float64)
    loss, top1, top5, n = run.backend.all_reduce_sum(sums).tolist()
    return {"val_loss": loss / n, "val_top1": top1 / n, "val_top5": top5 / n}


def to_device(run: Run, images: torch.Tensor, targets: torch.Tensor):
    """Move a batch to the device, in channels-last layout when that is on; the fast loader's uint8 images are
    normalised there (a quarter of the bytes to move, and the device's arithmetic), laid out in the same pass."""
    fmt = torch.channels_last if run.channels_last else torch.contiguous_format
    images = data.normalise(images.to(run.device, non_blocking=True), fmt)
    return images, targets.to(run.device, non_blocking=True)


def save_checkpoint(run: Run, step_in_epoch: int) -> None:
    """Called on every rank; rank 0 writes model, optimizer, schedule and progress, enough to resume mid-epoch.
    In pipeline mode each stage of replica 0 writes its own part first, under the single-device model's names (see
    checkpoint.py): no rank ever holds the whole model."""
    folder = args_checkpoints(run.args)
    parts = {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict()}
    if run.pipeline:
        parts = run.pipeline.stage_state(run.optimizer)
        if 0 < run.backend.rank < run.pipeline.stages:
            checkpoint.save_torch(
                checkpoint.stage_path(checkpoint.checkpoint_path(folder, run.step), run.pipeline.stage), parts
            )
        run.backend.all_reduce_sum(torch.zeros(1))  # every stage's part is on disk before rank 0 commits the step
    if not run.master:
        return
    state = {
        **parts,
        "stages": run.pipeline.stages if run.pipeline else 1,
        "arch": run.args.model,
        "classes": run.classes,
        "scheduler": run.scheduler.state_dict(),
        "epoch": run.epoch,
        "step": run.step,
        "history": run.history,
        "resumed_from": run.resumed_from,
        "samples_in_epoch": step_in_epoch * run.args.batch_size * run.replicas,
        "wall_seconds": run.wall_seconds(),
    }
    checkpoint.save_checkpoint(folder, state, run.step, run.args.keep_checkpoints)
    log.info("checkpoint step %d saved", run.step)  # what a resubmitting backend counts lost work from


def args_checkpoints(args) -> Path:
    """Where checkpoints live inside OUT."""
    return Path(args.out) / "checkpoints"


def finish(run: Run) -> None:
    """Check that the replicas hold the same parameters; rank 0 writes model.pt and metrics.json."""
    extra = {**memory_report(run), **pipeline_report(run)}  # measured before rank 0 puts model.pt together
    digest = metrics.parameter_digest(run.raw_model.named_parameters())  # of what this rank holds
    in_sync = parameters_in_sync(run, digest)
    log.info("final parameter digest %s (all workers identical: %s)", digest[:16], in_sync)
    whole = run.pipeline.whole_state() if run.pipeline else run.raw_model.state_dict()
    if run.master:
        if run.pipeline:  # the whole model's digest, as the single-device model's
            digest = metrics.parameter_digest((n, whole[n]) for n, _ in run.pipeline.whole.named_parameters())
        checkpoint.save_torch(
            Path(run.args.out) / "model.pt",
            {"arch": run.args.model, "classes": run.classes, "image_size": run.args.image_size, "state_dict": whole},
        )
        write_metrics(run, status="complete", parameters_in_sync=in_sync, parameter_digest=digest, **extra)
        log.info("results in %s", Path(run.args.out).resolve())
    run.tracker.close()
    run.backend.shutdown()


def parameters_in_sync(run: Run, digest: str) -> bool:
    """Whether every replica ends with the same parameters (in pipeline mode: each stage as its replicas), from each
    rank's digest: equal values are the only ones whose sum squared is the count times the sum of squares."""
    chunks = torch.tensor(metrics.digest_chunks(digest), dtype=torch.float64)
    sums = sum_over_replicas(run, torch.stack([chunks, chunks**2]))
    differs = not torch.equal(sums[1] * run.replicas, sums[0] ** 2)
    return run.backend.all_reduce_sum(torch.tensor([float(differs)])).item() == 0


def sum_over_replicas(run: Run, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the model's replicas: every worker, or in pipeline mode this stage's replicas."""
    return run.pipeline.sum_over_replicas(tensor) if run.pipeline else run.backend.all_reduce_sum(tensor)


def memory_report(run: Run) -> dict:
    """Per rank: the parameters it holds, the bytes of its parameters and buffers, its peak memory and the part of
    that peak its training added (its model, gradients, optimizer state and activations)."""
    held = metrics.held(run.pipeline.whole if run.pipeline else run.raw_model)  # the whole model, mostly meta
    return {
        "parameters_per_rank": [int(v) for v in rank_values(run.backend, held[0])],
        "parameter_bytes_per_rank": [int(v) for v in rank_values(run.backend, held[1])],
        "peak_memory_mb": rank_values(run.backend, peak_memory_mb(run.device)),
        "training_memory_mb": rank_values(run.backend, training_memory_mb(run.device, run.resident_before_model_mb)),
    }


def rank_values(backend: Backend, value: float) -> list[float]:
    """`value` of every rank, in rank order (a sum of one-hot vectors)."""
    mine = torch.zeros(backend.world_size, dtype=torch.float64)
    mine[backend.rank] = value
    return backend.all_reduce_sum(mine).tolist()


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory: GPU memory allocated on CUDA, its own peak resident set on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_resident_mb()


def training_memory_mb(device: torch.device, before_model_mb: float) -> float:
    """The peak memory that building and training the model added: on CUDA the allocated peak (which never held the
    CUDA context or the libraries), on the CPU the peak resident set above what the process held before its model
    (PyTorch, torchvision and the data set's index: the CPU's counterpart of the context)."""
    if device.type == "cuda":
        return peak_memory_mb(device)
    return peak_resident_mb() - before_model_mb


def pipeline_report(run: Run) -> dict:
    """Pipeline mode: the split, the schedule and each rank's measured idle share beside GPipe's theory."""
    if not run.pipeline:
        return {"parallel": "data"}
    p, args = run.pipeline, run.args
    idle, steps = rank_values(run.backend, p.idle_fraction()), p.steady_steps()
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


def write_metrics(run: Run, status: str, **extra) -> None:
    """Rank 0: metrics.json, rewritten after every epoch; status says whether the run is complete."""
    args, last = run.args, (run.history[-1] if run.history else {})
    summary = {
        "status": status,
        "framework": "pytorch",
        "model": args.model,
        "data": str(args.data),
        "num_classes": len(run.classes),
        "world_size": run.backend.world_size,
        "backend": run.backend.name,
        "device": str(run.device),
        "precision": "bf16" if run.amp else "fp32",
        "batch_size_per_worker": args.batch_size,
        "global_batch_size": args.batch_size * run.replicas,
        "base_lr": args.lr,
        "peak_lr": args.lr * run.replicas,
        "global_step": run.step,
        "resumed_from_steps": run.resumed_from,
        "wall_seconds": run.wall_seconds(),
        "final_val_top1": last.get("val_top1"),
        "final_val_top5": last.get("val_top5"),
        "images_per_sec": last.get("images_per_sec"),
        "data_wait_share": last.get("data_wait_share"),
        "steady_images_per_sec": last.get("steady_images_per_sec"),
        "versions": metrics.library_versions(),
        "cpu_ms_per_step": {
            "training_thread": last.get("training_thread_cpu_ms_per_step"),
            "other_threads": last.get("other_threads_cpu_ms_per_step"),
        },
        "trainer": str(Path(__file__).resolve().parent),  # which scripts version trained the model
        **run.data_facts,
        "epochs": run.history,
        **extra,
    }
    checkpoint.save_json(Path(args.out) / "metrics.json", summary)


def log_epoch(run: Run, row: dict) -> None:
    """One line per epoch on rank 0; the epoch's metrics to the tracker."""
    run.tracker.log(tracking.epoch_metrics(row), run.step)
    if run.master:
        console.epoch_done(row, run.args.epochs)


def resolve(choice: str, device: torch.device) -> bool:
    """auto means on for GPUs, off for the CPU."""
    return device.type == "cuda" if choice == "auto" else choice == "on"


def resolve_precision(choice: str, device: torch.device) -> str:
    """auto means bf16 autocast on GPU, fp32 on the CPU."""
    return ("bf16" if device.type == "cuda" else "fp32") if choice == "auto" else choice


if __name__ == "__main__":
    sys.exit(main())
