"""Command-line options of the training engines, declared once as types, and the checks made on them before
anything runs.

`CommonOptions` declares the options every framework's trainer takes (data, model, schedule, augmentation,
checkpoints, logging, tracking, bad files), `PyTorchOptions` the PyTorch trainer's own (loaders, torch.compile, the
torch.distributed backends, pipeline parallelism); trainer/tf/options.py declares the TensorFlow and Keras trainers'.
Each option is an annotated attribute, `name: Annotated[type, Help("...")] = default`: the trainer's parser is made
from it (`add_options`), and so are the orchestrator's config section (infra/engines), the CLI's help and the
reference pages. `check_args` and `check_common_args` refuse values that cannot train.
"""

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

from nodelib.cores import usable_cores
from nodelib.errors import UsageError
from nodelib.folders import cannot_write_in, nearest_existing
from trainer.tracking import check_trackers

# The classifiers of the pinned torchvision (torchvision.models.list_models(module=torchvision.models)), listed here
# so that the orchestrator checks training.model before anything starts without importing torch; the trainer checks
# --model against its own torchvision (trainer/models.py), and tests/unit/trainer/test_model_names.py keeps the two
# lists equal.
TORCHVISION_CLASSIFIERS = """
alexnet convnext_base convnext_large convnext_small convnext_tiny densenet121 densenet161 densenet169 densenet201
efficientnet_b0 efficientnet_b1 efficientnet_b2 efficientnet_b3 efficientnet_b4 efficientnet_b5 efficientnet_b6
efficientnet_b7 efficientnet_v2_l efficientnet_v2_m efficientnet_v2_s googlenet inception_v3 maxvit_t mnasnet0_5
mnasnet0_75 mnasnet1_0 mnasnet1_3 mobilenet_v2 mobilenet_v3_large mobilenet_v3_small regnet_x_16gf regnet_x_1_6gf
regnet_x_32gf regnet_x_3_2gf regnet_x_400mf regnet_x_800mf regnet_x_8gf regnet_y_128gf regnet_y_16gf regnet_y_1_6gf
regnet_y_32gf regnet_y_3_2gf regnet_y_400mf regnet_y_800mf regnet_y_8gf resnet101 resnet152 resnet18 resnet34
resnet50 resnext101_32x8d resnext101_64x4d resnext50_32x4d shufflenet_v2_x0_5 shufflenet_v2_x1_0 shufflenet_v2_x1_5
shufflenet_v2_x2_0 squeezenet1_0 squeezenet1_1 swin_b swin_s swin_t swin_v2_b swin_v2_s swin_v2_t vgg11 vgg11_bn
vgg13 vgg13_bn vgg16 vgg16_bn vgg19 vgg19_bn vit_b_16 vit_b_32 vit_h_14 vit_l_16 vit_l_32 wide_resnet101_2
wide_resnet50_2
"""
TORCHVISION_MODELS = tuple(TORCHVISION_CLASSIFIERS.split())


Loader = Literal["fast", "pil", "dali", "gpu"]  # the loaders: see data.py, dali.py and gpu_decode.py
LOADERS = get_args(Loader)
LoaderChoice = Literal["auto", "fast", "pil", "dali", "gpu"]  # --loader: auto picks one (train.choose_loader)
# --compile-mode: torch.compile's modes (reduce-overhead: CUDA graphs; max-autotune: Triton kernels tuned per shape)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES = get_args(CompileMode)
GradCompression = Literal["none", "fp16", "bf16"]  # --grad-compression: see distributed.py
GRAD_COMPRESSIONS = get_args(GradCompression)
Switch = Literal["auto", "on", "off"]
Workers = int | Literal["auto"]  # --loader-workers: a count, or auto (each trainer picks from the cores)


@dataclass(frozen=True)
class Help:
    """An option's help, as `Annotated[type, Help("...")]` in an options declaration: the trainer's --help, the
    config setting's description and the reference pages all read it."""

    text: str


class CommonOptions:
    """The options of every framework's trainer that are settings (the config's training section), with the
    ResNet-50-on-ImageNet reference case's defaults. A framework's declaration subclasses it, adds its own and may
    declare a common option again to give it help that is true of that framework (same type, same default).

    Not settings, added to every parser by `add_options`: --data and --out (each run's), --check and
    --check-workers (the preflight's)."""

    OUT_HELP = "results folder: checkpoints, metrics.json, model.pt; resumed if it holds a checkpoint"

    model: Annotated[str, Help("torchvision model name")] = "resnet50"
    image_size: Annotated[int, Help("side of the square crops the model sees")] = 224
    min_crop_scale: Annotated[float, Help("smallest area fraction of the random-resized crop")] = 0.08
    hflip: Annotated[bool, Help("random horizontal flips")] = True
    loader_workers: Annotated[
        Workers,
        Help(
            "DataLoader worker processes per training process (0: none, the training process loads); auto: from "
            "the CPU cores each training process has and the loader (the log and metrics.json say how many)"
        ),
    ] = "auto"
    steps_per_epoch: Annotated[int, Help("cap on steps per epoch; synthetic data needs it (default 100 there)")] = 0
    num_classes: Annotated[int, Help("classes of synthetic data (real data: the class folders)")] = 1000
    seed: Annotated[int, Help("seed of initialisation, shuffling and augmentation")] = 0
    init_from: Annotated[
        str,
        Help(
            "fine-tune: start from these weights, not from scratch: the model file of an earlier run (model.pt; "
            "model.keras for TensorFlow and Keras, which convert PyTorch's too), a torchvision weights file, or "
            "imagenet (torchvision's weights of --model, downloaded once); the classifier is made anew for the "
            "data's classes. Empty: from scratch. A run that resumes a checkpoint ignores it"
        ),
    ] = ""
    epochs: Annotated[int, Help("passes over the training split")] = 90
    batch_size: Annotated[int, Help("images per worker per step")] = 32
    lr: Annotated[float, Help("one-worker learning rate; scaled by the number of workers")] = 0.0125
    momentum: Annotated[float, Help("SGD momentum")] = 0.9
    weight_decay: Annotated[float, Help("L2 penalty")] = 1e-4
    warmup_epochs: Annotated[float, Help("linear ramp from the one-worker rate to the scaled rate")] = 5.0
    schedule: Annotated[
        Literal["cosine", "step"], Help("decay after warmup: cosine to zero, or /10 at --lr-decay-epochs")
    ] = "cosine"
    lr_decay_epochs: Annotated[str, Help("epochs at which the step schedule divides the rate by 10")] = "30,60,80"
    device: Annotated[Literal["auto", "cpu", "cuda"], Help("auto: a GPU when there is one")] = "auto"
    precision: Annotated[Literal["auto", "bf16", "fp32"], Help("auto: bf16 autocast on GPU, fp32 on CPU")] = "auto"
    threads: Annotated[int, Help("CPU threads per worker; 0 shares the cores among the local workers")] = 0
    checkpoint_every: Annotated[
        int, Help("steps between checkpoints (also one at each epoch end); 0: epoch ends only")
    ] = 500
    keep_checkpoints: Annotated[int, Help("newest checkpoints kept")] = 3
    log_every: Annotated[int, Help("steps between progress lines")] = 20
    tracking_uri: Annotated[
        str,
        Help(
            "MLflow tracking URI that the rank reporting the loss logs metrics to while training (needs "
            "mlflow-skinny); empty: no tracking"
        ),
    ] = ""
    tracking_run_id: Annotated[
        str,
        Help(
            "MLflow run to log into (the flow makes one per pipeline run); empty: a new run in the experiment trainflow"
        ),
    ] = ""
    tensorboard: Annotated[
        str,
        Help(
            "folder of TensorBoard event files (needs tensorboard): the run's go to a subfolder named after --out, "
            "beside other runs'; empty: none"
        ),
    ] = ""
    verify_images: Annotated[
        bool,
        Help(
            "decode every image once before training (with --check: all of them; in training: each worker its "
            "share); not needed where DATA/.verified.json vouches for the data version"
        ),
    ] = False
    bad_files: Annotated[
        Literal["fail", "skip"],
        Help(
            "images that cannot be decoded: fail refuses them all in one line (two or more listed in "
            "OUT/bad-files.tsv); skip trains without them, listed in OUT/bad-files.tsv and metrics.json"
        ),
    ] = "fail"


class PyTorchOptions(CommonOptions):
    """The PyTorch trainer's options (train.py): the common ones and its loaders, torch.compile, its backends and
    pipeline parallelism."""

    loader: Annotated[
        LoaderChoice,
        Help(
            "auto: gpu on a CUDA device where torchvision decodes JPEGs, else fast (the log and metrics.json say "
            "which); fast: only the training crop of a JPEG decoded (libjpeg-turbo), straight to uint8 tensors, "
            "normalised on the device; pil: PIL images, normalised floats made by the loader (the original path); "
            "dali: NVIDIA DALI (GPU decoding on a GPU, its CPU mode otherwise; pip install 'trainflow[dali]'); gpu: "
            "the workers read the files and draw the fast loader's crops, a thread of the training process decodes "
            "each batch on the device (nvJPEG, batched, on a GPU), where one kernel crops, resizes and flips the "
            "whole batch; PNG, CMYK and what the device refuses are decoded on the CPU"
        ),
    ] = "auto"
    pin_memory: Annotated[Switch, Help("auto: on when training on a GPU")] = "auto"
    compile: Annotated[
        Literal["auto", "off", "on"],
        Help(
            "torch.compile the model (TorchDynamo + Inductor); auto: on for a GPU, where it raises the images/s "
            "(figures: docs/benchmarks/index.md), off on the CPU (its first steps pay minutes of compiling); never "
            "in pipeline mode"
        ),
    ] = "auto"
    compile_mode: Annotated[
        CompileMode,
        Help(
            "torch.compile's mode, with --compile on (or auto on a GPU): reduce-overhead replays the step as CUDA "
            "graphs, max-autotune also tunes Triton kernels per shape (minutes of compiling), "
            "max-autotune-no-cudagraphs tunes without the graphs"
        ),
    ] = "default"
    fused_optimizer: Annotated[
        Switch,
        Help(
            "SGD's update as one fused kernel over every parameter (fused=True) rather than a kernel per parameter "
            "and step (off: torch's default, foreach on CUDA); auto: on for CUDA and the CPU, where torch has it"
        ),
    ] = "auto"
    channels_last: Annotated[Switch, Help("auto: on for GPU")] = "auto"
    backend: Annotated[Literal["auto", "single", "ddp", "horovod"], Help("auto: from the launcher's environment")] = (
        "auto"
    )
    grad_compression: Annotated[
        GradCompression,
        Help(
            "the gradients' type in the all-reduce: none (float32); fp16 (DDP and Horovod) or bf16 (DDP only) halve "
            "the bytes sent, for slow links between nodes (no faster on one CPU machine)"
        ),
    ] = "none"
    parallel: Annotated[
        Literal["data", "pipeline"],
        Help("data: every worker holds the model; pipeline: the model split into --stages (torchrun only)"),
    ] = "data"
    stages: Annotated[int, Help("pipeline: stages the model is split into; the world is stages x replicas")] = 1
    microbatches: Annotated[
        int, Help("micro-batches per step (must divide --batch-size): pipelined, or gradient accumulation in data mode")
    ] = 1
    pipeline_schedule: Annotated[Literal["gpipe", "1f1b"], Help("pipeline: the micro-batch schedule")] = "gpipe"
    balance: Annotated[
        Literal["params", "time"],
        Help("pipeline: balance the stages by parameter count or by measured forward+backward time"),
    ] = "params"


def build_parser() -> argparse.ArgumentParser:
    """The PyTorch engine's arguments; defaults are the ResNet-50-on-ImageNet reference case."""
    p = argparse.ArgumentParser(
        prog="train.py",
        description="Training of a torchvision classifier: data-parallel, or pipeline-parallel over stages.",
    )
    add_options(p, PyTorchOptions)
    return p


def add_options(p: argparse.ArgumentParser, options: type[CommonOptions]) -> None:
    """An argument for every option that `options` declares, after --data and --out, with --check and
    --check-workers after the common ones (the order of --help)."""
    p.add_argument(
        "--data", required=True, help="ImageNet-layout folder (train/<class>/..., val/<class>/...) or 'synthetic'"
    )
    p.add_argument("--out", required=True, type=Path, help=options.OUT_HELP)
    hints, common = option_hints(options), option_hints(CommonOptions)
    for name in [*common, "", *(n for n in hints if n not in common)]:
        if name:
            p.add_argument("--" + name.replace("_", "-"), **argument(hints[name], getattr(options, name)))
        else:
            add_check_options(p)


def option_hints(options: type[CommonOptions]) -> dict[str, Any]:
    """The options that `options` declares, in order, with their `Annotated` types."""
    return get_type_hints(options, include_extras=True)


def option_help(options: type[CommonOptions], name: str) -> str:
    """The help of option `name` (a setting's name: batch_size) of `options`."""
    return next(m.text for m in get_args(option_hints(options)[name]) if isinstance(m, Help))


def argument(hint: Any, default: object) -> dict[str, Any]:
    """argparse's keywords for an option of type `hint` (Annotated[type, Help]) and `default`."""
    kind, *extras = get_args(hint)
    spec: dict[str, Any] = {"default": default, "help": next(m.text for m in extras if isinstance(m, Help))}
    if get_origin(kind) is Literal:
        spec["choices"] = get_args(kind)
    elif kind == Workers:
        spec["type"], spec["metavar"] = count_or_auto, "N|auto"
    elif kind is bool:
        spec["action"] = argparse.BooleanOptionalAction
    elif kind is not str:
        spec["type"] = kind
    return spec


def count_or_auto(text: str) -> int | str:
    """A --loader-workers value: auto, or a whole number (its range is check_common_args's)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number or auto, not {text!r}") from None


def cores_per_process(local_processes: int) -> int:
    """The CPU cores this process may use, shared evenly among the machine's `local_processes` training processes
    (at least 1): what --threads 0 and --loader-workers auto start from."""
    return max(1, usable_cores() // local_processes)


def add_check_options(p: argparse.ArgumentParser) -> None:
    """The preflight's options (not settings)."""
    p.add_argument(
        "--check",
        action="store_true",
        help="check the arguments, output folder, data and model in one process, then exit",
    )
    p.add_argument("--check-workers", type=int, default=1, help="with --check: the number of workers the run will have")


def check_args(args: argparse.Namespace) -> None:
    """Reject values that cannot train, naming the option and a valid range (the PyTorch trainer's)."""
    check_common_args(args, at_least_one=("stages", "microbatches"))
    if args.parallel == "data" and args.stages > 1:
        raise UsageError("--stages needs --parallel pipeline")
    check_microbatches(args.batch_size, args.microbatches)
    if args.parallel == "pipeline" and args.init_from:  # each stage holds a part: the whole model is never built
        raise UsageError("--init-from trains data-parallel: leave out --parallel pipeline to fine-tune")
    if args.parallel == "pipeline" and args.backend == "horovod":
        raise UsageError("Horovod has no pipeline parallelism; run --parallel pipeline under torchrun")
    if args.compile_mode != "default" and (args.compile == "off" or args.parallel == "pipeline"):
        raise UsageError(
            f"--compile-mode {args.compile_mode} needs a compiled model: pass --compile on (or auto, on a GPU) "
            "with --parallel data, or leave --compile-mode out"
        )


def check_common_args(args: argparse.Namespace, at_least_one: tuple[str, ...] = ()) -> None:
    """Reject values of the common options (and of a framework's own `at_least_one`) that cannot train, naming
    the option and a valid range."""
    for name in ["epochs", "batch_size", "image_size", "keep_checkpoints", "log_every", "num_classes", *at_least_one]:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    counts = ["threads", "checkpoint_every", "steps_per_epoch", "warmup_epochs", "weight_decay", "momentum"]
    for name in counts + (["loader_workers"] if args.loader_workers != "auto" else []):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative (got {getattr(args, name)})")
    if args.lr <= 0:
        raise UsageError(f"--lr must be positive (got {args.lr})")
    if not 0 < args.min_crop_scale <= 1:
        raise UsageError(f"--min-crop-scale must be in (0, 1] (got {args.min_crop_scale})")
    decay_epochs(args.lr_decay_epochs)
    check_trackers(args.tracking_uri, args.tensorboard)


def check_model_in(name: str, names: "list[str] | tuple[str, ...]") -> None:
    """Fail, naming known models close to `name`, when it is not one of torchvision's classifiers `names`."""
    if name not in names:
        close = [n for n in names if n.startswith(name[:4])][:8] or list(names[:8])
        raise UsageError(f"unknown model {name!r} (--model); pick a torchvision classifier such as {', '.join(close)}")


def check_layout(world: int, stages: int, batch: int, microbatches: int) -> None:
    """Refuse a world that the stages do not divide, or a batch that the micro-batches do not divide."""
    if world % stages:
        raise UsageError(
            f"the world size {world} is not a multiple of --stages {stages}; start stages x replicas processes"
        )
    check_microbatches(batch, microbatches)


def check_batch_fits(batch_size: int, replicas: int, images: int, stages: int = 1, where: str = "") -> None:
    """Every data-parallel replica (a worker, or in pipeline mode a pipeline of `stages` workers) needs a full batch
    each epoch: the one rule, which the orchestrator runs on the data folder before staging (its message in the
    config's words) and the trainer on the images it trains on."""
    if batch_size * replicas > images:
        who = f"{replicas} workers" if stages == 1 else f"{replicas} pipeline replicas (--stages {stages})"
        raise UsageError(
            f"--batch-size {batch_size} x {who} is more than the {images} training images{where}; "
            "lower --batch-size or the world size"
        )


def check_microbatches(batch: int, microbatches: int) -> None:
    """Refuse a batch that the micro-batches do not divide."""
    if batch % microbatches:
        raise UsageError(
            f"--batch-size {batch} is not divisible by --microbatches {microbatches}; "
            "pick a batch size that is a multiple of the micro-batches"
        )


def decay_epochs(text: str) -> tuple[float, ...]:
    """Parse --lr-decay-epochs ("30,60,80")."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--lr-decay-epochs must be comma-separated numbers such as 30,60,80 (got {text!r})") from None


def check_output_folder(out: Path) -> None:
    """Prove the results folder can be written without creating it (a refused run leaves nothing behind).
    Results create it as they are written."""
    existing = nearest_existing(out)
    if os.path.exists(existing) and not existing.is_dir():
        raise UsageError(
            f"output folder {out} is not writable ({existing} is a file, not a folder); pass a writable --out"
        )
    if why := cannot_write_in(existing):
        raise UsageError(f"output folder {out} is not writable ({why}); pass a writable --out")
