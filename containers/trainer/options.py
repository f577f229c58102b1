"""Command-line options of the training engines, and the checks made on them before anything runs.

Every framework's trainer takes the common options (`add_common_options`, checked by `check_common_args`): data,
results, model, schedule, augmentation, checkpoints, logging, tracking, bad files and the preflight's --check.
`build_parser` is the PyTorch trainer's (train.py): the common options and its own (loaders, torch.compile, the
torch.distributed backends, pipeline parallelism); trainer/tf/options.py is the TensorFlow and Keras trainers'.
"""

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import UsageError
from trainer.folders import cannot_write_in, nearest_existing
from trainer.tracking import check_trackers

LOADERS = ("fast", "pil", "dali", "gpu")  # --loader: see data.py, dali.py and gpu_decode.py
# --compile-mode: torch.compile's modes (reduce-overhead: CUDA graphs; max-autotune: Triton kernels tuned per shape)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
GRAD_COMPRESSIONS = ("none", "fp16", "bf16")  # --grad-compression: see distributed.py
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


@dataclass(frozen=True)
class FrameworkHelp:
    """The help of the common options whose meaning depends on the framework."""

    out: str
    """--out: what the results folder holds."""
    model: str
    """--model: which models there are."""
    loader_workers: str
    """--loader-workers: what does the loading in parallel."""
    device: str
    """--device: what auto picks."""
    precision: str
    """--precision: what auto and bf16 mean."""
    threads: str = "CPU threads per worker; 0 shares the cores among the local workers"


PYTORCH_HELP = FrameworkHelp(
    out="results folder: checkpoints, metrics.json, model.pt; resumed if it holds a checkpoint",
    model="torchvision model name",
    loader_workers="DataLoader worker processes per training process",
    device="auto: a GPU when there is one",
    precision="auto: bf16 autocast on GPU, fp32 on CPU",
)


def build_parser() -> argparse.ArgumentParser:
    """The PyTorch engine's arguments; defaults are the ResNet-50-on-ImageNet reference case."""
    p = argparse.ArgumentParser(
        prog="train.py",
        description="Training of a torchvision classifier: data-parallel, or pipeline-parallel over stages.",
    )
    add_common_options(p, PYTORCH_HELP)
    add_pytorch_options(p)
    return p


def add_common_options(p: argparse.ArgumentParser, helps: FrameworkHelp) -> None:
    """The options of every framework's trainer, with the ResNet-50-on-ImageNet reference case's defaults."""
    add_data_options(p, helps)
    add_optimizer_options(p)
    add_run_options(p, helps)
    add_check_options(p)


def add_data_options(p: argparse.ArgumentParser, helps: FrameworkHelp) -> None:
    """Where the data and results are, the model, and how images are augmented and loaded."""
    p.add_argument(
        "--data", required=True, help="ImageNet-layout folder (train/<class>/..., val/<class>/...) or 'synthetic'"
    )
    p.add_argument("--out", required=True, type=Path, help=helps.out)
    p.add_argument("--model", default="resnet50", help=helps.model)
    p.add_argument("--image-size", type=int, default=224, help="side of the square crops the model sees")
    p.add_argument(
        "--min-crop-scale", type=float, default=0.08, help="smallest area fraction of the random-resized crop"
    )
    p.add_argument("--hflip", action=argparse.BooleanOptionalAction, default=True, help="random horizontal flips")
    p.add_argument("--loader-workers", type=int, default=4, help=helps.loader_workers)
    p.add_argument(
        "--steps-per-epoch",
        type=int,
        default=0,
        help="cap on steps per epoch; synthetic data needs it (default 100 there)",
    )
    p.add_argument(
        "--num-classes", type=int, default=1000, help="classes of synthetic data (real data: the class folders)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, shuffling and augmentation")


def add_optimizer_options(p: argparse.ArgumentParser) -> None:
    """Synchronous SGD and its learning-rate schedule (trainer/schedule.py)."""
    p.add_argument("--epochs", type=int, default=90, help="passes over the training split")
    p.add_argument("--batch-size", type=int, default=32, help="images per worker per step")
    p.add_argument("--lr", type=float, default=0.0125, help="one-worker learning rate; scaled by the number of workers")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="L2 penalty")
    p.add_argument(
        "--warmup-epochs", type=float, default=5.0, help="linear ramp from the one-worker rate to the scaled rate"
    )
    p.add_argument(
        "--schedule",
        choices=["cosine", "step"],
        default="cosine",
        help="decay after warmup: cosine to zero, or /10 at --lr-decay-epochs",
    )
    p.add_argument(
        "--lr-decay-epochs", default="30,60,80", help="epochs at which the step schedule divides the rate by 10"
    )


def add_run_options(p: argparse.ArgumentParser, helps: FrameworkHelp) -> None:
    """Where and how each worker runs, and what it records: checkpoints, progress lines, tracking."""
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help=helps.device)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto", help=helps.precision)
    p.add_argument("--threads", type=int, default=0, help=helps.threads)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=500,
        help="steps between checkpoints (also one at each epoch end); 0: epoch ends only",
    )
    p.add_argument("--keep-checkpoints", type=int, default=3, help="newest checkpoints kept")
    p.add_argument("--log-every", type=int, default=20, help="steps between progress lines")
    p.add_argument(
        "--tracking-uri",
        default="",
        help="MLflow tracking URI that the rank reporting the loss logs "
        "metrics to while training (needs mlflow-skinny); empty: no tracking",
    )
    p.add_argument(
        "--tracking-run-id",
        default="",
        help="MLflow run to log into (the flow makes one per "
        "pipeline run); empty: a new run in the experiment trainflow",
    )
    p.add_argument(
        "--tensorboard",
        default="",
        help="folder of TensorBoard event files (needs tensorboard): the "
        "run's go to a subfolder named after --out, beside other runs'; empty: none",
    )


def add_check_options(p: argparse.ArgumentParser) -> None:
    """Images that cannot be decoded, and the preflight (--check)."""
    p.add_argument(
        "--verify-images",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="decode every image once before training (with --check: all of them; in training: each worker "
        "its share); not needed where DATA/.verified.json vouches for the data version",
    )
    p.add_argument(
        "--bad-files",
        choices=["fail", "skip"],
        default="fail",
        help="images that cannot be decoded: fail refuses them all in one line (two or more listed in "
        "OUT/bad-files.tsv); skip trains without them, listed in OUT/bad-files.tsv and metrics.json",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the arguments, output folder, data and model in one process, then exit",
    )
    p.add_argument("--check-workers", type=int, default=1, help="with --check: the number of workers the run will have")


def add_pytorch_options(p: argparse.ArgumentParser) -> None:
    """The PyTorch trainer's own: its loaders, torch.compile, its backends and pipeline parallelism."""
    p.add_argument(
        "--loader",
        choices=LOADERS,
        default="fast",
        help="fast: only the training crop of a JPEG decoded (libjpeg-turbo), straight to uint8 tensors, "
        "normalised on the device; "
        "pil: PIL images, normalised floats made by the loader (the original path); dali: NVIDIA "
        "DALI (GPU decoding on a GPU, its CPU mode otherwise; pip install 'trainflow[dali]'); gpu: the workers "
        "read the files and draw the fast loader's crops, a thread of the training process decodes each batch on "
        "the device (nvJPEG, batched, on a GPU) and crops, resizes and flips there; PNG, CMYK and what the "
        "device refuses are decoded on the CPU",
    )
    p.add_argument(
        "--pin-memory", choices=["auto", "on", "off"], default="auto", help="auto: on when training on a GPU"
    )
    p.add_argument(
        "--compile",
        choices=["auto", "off", "on"],
        default="auto",
        help="torch.compile the model (TorchDynamo + Inductor); auto: on for a GPU (1.26x ResNet-50's "
        "images/s on one H100, README: Benchmark), off on the CPU (its first steps pay minutes of "
        "compiling); never in pipeline mode",
    )
    p.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="torch.compile's mode, with --compile on (or auto on a GPU): reduce-overhead replays the step as CUDA "
        "graphs, max-autotune also tunes Triton kernels per shape (minutes of compiling), "
        "max-autotune-no-cudagraphs tunes without the graphs",
    )
    p.add_argument(
        "--fused-optimizer",
        choices=["auto", "on", "off"],
        default="auto",
        help="SGD's update as one fused kernel over every parameter (fused=True) rather than a kernel per parameter "
        "and step (off: torch's default, foreach on CUDA); auto: on for CUDA and the CPU, where torch has it",
    )
    p.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto", help="auto: on for GPU")
    p.add_argument(
        "--backend",
        choices=["auto", "single", "ddp", "horovod"],
        default="auto",
        help="auto: from the launcher's environment",
    )
    p.add_argument(
        "--grad-compression",
        choices=GRAD_COMPRESSIONS,
        default="none",
        help="the gradients' type in the all-reduce: none (float32); fp16 (DDP and Horovod) or bf16 (DDP "
        "only) halve the bytes sent, for slow links between nodes (no faster on one CPU machine)",
    )
    p.add_argument(
        "--parallel",
        choices=["data", "pipeline"],
        default="data",
        help="data: every worker holds the model; pipeline: the model split into --stages (torchrun only)",
    )
    p.add_argument(
        "--stages", type=int, default=1, help="pipeline: stages the model is split into; the world is stages x replicas"
    )
    p.add_argument(
        "--microbatches",
        type=int,
        default=1,
        help="micro-batches per step (must divide --batch-size): pipelined, or gradient accumulation in data mode",
    )
    p.add_argument(
        "--pipeline-schedule", choices=["gpipe", "1f1b"], default="gpipe", help="pipeline: the micro-batch schedule"
    )
    p.add_argument(
        "--balance",
        choices=["params", "time"],
        default="params",
        help="pipeline: balance the stages by parameter count or by measured forward+backward time",
    )


def check_args(args: argparse.Namespace) -> None:
    """Reject values that cannot train, naming the option and a valid range (the PyTorch trainer's)."""
    check_common_args(args, at_least_one=("stages", "microbatches"))
    if args.parallel == "data" and args.stages > 1:
        raise UsageError("--stages needs --parallel pipeline")
    check_microbatches(args.batch_size, args.microbatches)
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
    for name in [
        "loader_workers",
        "threads",
        "checkpoint_every",
        "steps_per_epoch",
        "warmup_epochs",
        "weight_decay",
        "momentum",
    ]:
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
