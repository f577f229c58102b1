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

import logging
import os
import socket
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the `trainer` package importable, its scripts version checked
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[1]))
    from nodelib.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported

import torch

from nodelib.errors import UsageError
from nodelib.layout import SYNTHETIC
from trainer import badfiles, checkpoint, console, core, data, gpu_decode, tracking
from trainer.distributed import Backend, leave_process_group, make_backend, pick_device
from trainer.memory import resident_mb
from trainer.models import build_model, build_on_meta, check_model_name, start_from
from trainer.options import build_parser, check_args, check_layout, check_output_folder, cores_per_process
from trainer.pipeline import Pipeline, blocks_of, parameter_costs, partition
from trainer.recipe import SYNTHETIC_STEPS
from trainer.schedule import lr_factor
from trainer.torch_adapter import PyTorch, epoch_steps, logits

log = logging.getLogger("trainer")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, train, and turn bad input into a one-line error with exit status 2."""
    return console.run_main(build_parser().parse_args(argv), check_args, check_only, train, leave_process_group)


def check_only(args) -> int:
    """Validate the arguments, output folder, data (decoding every image with --verify-images), the checkpoints in
    OUT and the model (core.check_only), and in pipeline mode the layout and the split."""
    replicas = args.check_workers
    if args.parallel == "pipeline":
        check_layout(args.check_workers, args.stages, args.batch_size, args.microbatches)
        replicas = args.check_workers // args.stages
    num_classes = core.check_only(args, CHECKS, replicas)
    if args.parallel == "pipeline":
        check_splittable(args, num_classes)
    return 0


def newest_progress(folder: Path) -> dict | None:
    """The newest checkpoint in `folder` (its progress beside its tensors, memory-mapped: none read), if any."""
    found = checkpoint.latest_checkpoint(folder)
    return checkpoint.load_checkpoint(found) if found else None


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


def load_start(args, classes: list[str]) -> dict:
    """--init-from's weights loaded into a fresh model for `classes` (the preflight's check of them)."""
    return start_from(build_model(args.model, len(classes)), args.init_from, args.model, classes)


CHECKS = core.Checks(check_model_name, newest_progress, try_one_step, load_start)


def train(args) -> None:
    """Set up this worker, resume if OUT holds a checkpoint, train every epoch, write the results (core.train)."""
    core.train(set_up(args))


def set_up(args) -> core.Run:
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
    torch.set_num_threads(args.threads or cores_per_process(backend.local_world_size))
    torch.manual_seed(args.seed)
    if backend.rank == 0:
        check_output_folder(args.out)
    replica, replicas = data_shard(args, backend)
    channels_last = resolve(args.channels_last, device)
    train_batches, val_batches, classes, facts = make_batches(args, backend, device, channels_last, replica, replicas)
    before_model = resident_mb()
    raw, pipeline = build_for_rank(args, backend, len(classes), device, channels_last)
    optimizer: torch.optim.Optimizer = make_optimizer(args, raw, device)
    state = load_latest_checkpoint(args, classes, raw, optimizer, pipeline)
    if state is None and args.init_from:  # a resumed run goes on from its own weights
        loaded = start_from(raw, args.init_from, args.model, classes)
        facts["init_from"] = console.started_from(loaded) if backend.rank == 0 else loaded
    model, optimizer = wrap_for_backend(args, backend, device, raw, optimizer, pipeline, state)
    schedule = core.make_schedule(args, epoch_steps(train_batches, args), replicas)
    adapter = PyTorch(
        args,
        backend,
        device,
        model,
        raw,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, schedule)),
        train_batches,
        val_batches,
        amp=resolve_precision(args.precision, device) == "bf16",
        channels_last=channels_last,
        pipeline=pipeline,
        resident_before_model_mb=before_model,
    )
    run = core.Run(args, adapter, classes, facts, schedule)
    if state is not None:
        adapter.restore_schedule(state)
        core.restore(run, state, checkpoint.checkpoint_path(core.checkpoints_folder(args), state["step"]).name)
    run.tracker = tracking.open_tracker(args, adapter.reports_loss)
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
        steps = args.steps_per_epoch or SYNTHETIC_STEPS
        batches = data.SyntheticBatches(
            args.batch_size, args.image_size, args.num_classes, steps, args.seed + shard, device, channels_last
        )
        return batches, None, core.synthetic_classes(args.num_classes), {}
    args.loader = choose_loader(args.loader, device)
    args.loader_workers = choose_loader_workers(args.loader_workers, args.loader, device, backend.local_world_size)
    splits, rank, world = data.index_folder(Path(args.data)), backend.rank, backend.world_size
    out = Path(args.out)
    train_split, val_split, record, _ = badfiles.usable_splits(args, out, splits, rank, world, backend.gather)
    facts = badfiles.data_facts(args, Path(args.out), train_split, val_split, record)
    data.check_batch_fits(args.batch_size, shards, len(train_split.samples), args.stages)
    pin = resolve(args.pin_memory, device)
    train_set = data.image_files(
        train_split, data.train_transform(args.image_size, args.min_crop_scale, args.hflip, args.loader), args.loader
    )
    facts["loader"], facts["loader_workers"] = args.loader, args.loader_workers
    facts["jpeg_decoding"] = check_loader(args, backend.rank, device, train_split)
    sampler = data.ResumableSampler(train_set, shards, shard, shuffle=True, seed=args.seed)
    train_batches = data.make_loader(train_set, args.batch_size, sampler, args.loader_workers, pin, True, device)
    if isinstance(train_batches, gpu_decode.DeviceBatches):  # counted as it trains: each metrics.json says so far
        facts["gpu_decoding"] = train_batches.tally
    if val_split is None:
        log.warning("no val/ folder in %s: training without validation", args.data)
        return train_batches, None, train_split.classes, facts
    val_set = data.image_files(val_split, data.val_transform(args.image_size, args.loader), args.loader)
    val_sampler = data.ShardSampler(len(val_set), shard, shards)  # a pipeline's stages pass the same batches on
    val_batches = data.make_loader(val_set, args.batch_size, val_sampler, args.loader_workers, pin, False, device)
    return train_batches, val_batches, train_split.classes, facts


def choose_loader(requested: str, device: torch.device) -> str:
    """The loader that --loader auto stands for (and says so in the log): gpu on a CUDA device where torchvision
    decodes JPEGs (the batch decoded by nvJPEG, then one kernel: the CPU cores only read the files), else fast.
    Another loader asked for by name is that one."""
    if requested != "auto":
        return requested
    chosen, why = "fast", f"{device.type} is not a CUDA device"
    if device.type == "cuda":
        try:
            gpu_decode.check_device(device)
            chosen, why = "gpu", f"torchvision decodes JPEGs on {device}"
        except UsageError as exc:
            why = str(exc).split(";")[0]
    log.info("loader: %s (--loader auto: %s)", chosen, why)
    return chosen


def choose_loader_workers(requested: int | str, loader: str, device: torch.device, local_processes: int) -> int:
    """The DataLoader workers (DALI's threads) that --loader-workers auto stands for, from the CPU cores each of the
    machine's `local_processes` training processes has (says so in the log); a number asked for is that one."""
    if requested != "auto":
        return int(requested)
    cores = cores_per_process(local_processes)
    workers, why = loader_workers_for(loader, device.type, cores)
    log.info("loader workers: %d (--loader-workers auto: %d cores a training process; %s)", workers, cores, why)
    return workers


# --loader gpu's workers only read files and draw crops (the device decodes): a few suffice. NVIDIA's MLPerf
# configuration gives DALI 6 CPU threads a GPU; the device check times a worker's share (its read_draw_pack stage).
GPU_LOADER_WORKERS = 4
DALI_THREADS = 6


def loader_workers_for(loader: str, device_type: str, cores: int) -> tuple[int, str]:
    """(workers, why) for `loader` training on a `device_type` device with `cores` CPU cores: the decoding loaders
    on a GPU get the cores but a quarter kept for the training process (on an H200 with 16 cores, 2026-11-27, issue
    46: the fast loader's 15 workers gave 0.80 of synthetic data's images/s, 11 gave 0.85, the busy cores slowing
    the compiled step itself); on the CPU the model's threads need the cores, and the loaders get a quarter."""
    if device_type == "cuda" and loader == "gpu":
        return min(GPU_LOADER_WORKERS, max(1, cores - 2)), "gpu: the workers only read the files, the GPU decodes"
    if device_type == "cuda" and loader == "dali":
        return min(DALI_THREADS, max(1, cores - 2)), "dali: its threads feed the GPU's decoders"
    if device_type == "cuda":
        return max(1, cores - max(1, cores // 4)), f"{loader} decodes on the CPU: a quarter kept for training"
    return max(1, cores // 4), "training on the CPU: three quarters of the cores kept for the model"


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
            "(more images/s per core; figures: docs/benchmarks/index.md)",
            *lacking,
        )
    return "crop"


def load_latest_checkpoint(
    args: Namespace, classes: list[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, pipeline
) -> dict | None:
    """The newest checkpoint in OUT with the model weights already loaded (in pipeline mode: this stage's tensors
    and optimizer state only), or None."""
    found = checkpoint.latest_checkpoint(core.checkpoints_folder(args))
    if found is None:
        return None
    state = checkpoint.load_checkpoint(found)  # any layout's, as the single-device model's
    core.check_resumable(state, args.model, classes, args.out)
    if pipeline:
        pipeline.load_stage(state["model"], state["optimizer"], optimizer)
    else:
        model.load_state_dict(state["model"])
    return state


def wrap_for_backend(
    args: Namespace,
    backend: Backend,
    device: torch.device,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pipeline: Pipeline | None,
    state: dict | None,
) -> tuple[Any, torch.optim.Optimizer]:
    """(the model that trains, its optimizer): wrapped for the backend, the optimizer restored, rank 0's state
    synced (in pipeline mode the stages average their gradients themselves, and every rank starts from the same
    seed), compiled."""
    if pipeline is not None:
        backend.broadcast_state(model, optimizer)
        return model, optimizer
    wrapped, optimizer = backend.wrap(model, optimizer, args.microbatches, args.grad_compression)
    if state is not None:  # after wrapping: Horovod's optimizer starts with empty state
        optimizer.load_state_dict(state["optimizer"])
    backend.broadcast_state(model, optimizer)
    # the wrapped model: under DDP, TorchDynamo splits the graph at the gradient buckets so that the all-reduce still
    # overlaps the backward pass; checkpoints keep using the unwrapped model's names
    return compile_model(wrapped, args.compile, device, args.compile_mode), optimizer


def compile_model(model: torch.nn.Module, choice: str, device: torch.device, mode: str = "default") -> Any:
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


def resolve(choice: str, device: torch.device) -> bool:
    """auto means on for GPUs, off for the CPU."""
    return device.type == "cuda" if choice == "auto" else choice == "on"


def resolve_precision(choice: str, device: torch.device) -> str:
    """auto means bf16 autocast on GPU, fp32 on the CPU."""
    return ("bf16" if device.type == "cuda" else "fp32") if choice == "auto" else choice


if __name__ == "__main__":
    sys.exit(main())
